"""The README stays a short front page and `docs/` carries the rest: the README's size, its first screen, its index
of `docs/`, and the two generated blocks (`python scripts/update_docs.py` writes them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _update_docs():
    from scripts import update_docs

    return update_docs


def _generated(page: str) -> str:
    text = (ROOT / page).read_text()
    module = _update_docs()
    assert module.BEGIN in text and module.END in text, f"{page} lost its generated block's markers"
    return text[text.index(module.BEGIN) + len(module.BEGIN) : text.index(module.END)]


def _docs_links(text: str) -> set[str]:
    """The `docs/*.md` pages a markdown text links to (as the README links them: `](docs/x.md)`)."""
    return set(re.findall(r"\]\((docs/[\w./-]+\.md)(?:#[\w-]*)?\)", text))


def test_readme_is_at_most_15_kb():
    size = len(README.read_bytes())
    assert size <= 15 * 1024, f"README.md is {size} bytes, over 15 KB: move the detail into docs/"


def test_the_two_set_up_commands_are_on_the_first_screen():
    first = "\n".join(README.read_text().splitlines()[:30])
    missing = [command for command in ("make run", "make test") if command not in first]
    assert not missing, f"README's first 30 lines lack {missing}"


def test_every_docs_page_the_readme_links_exists():
    gone = sorted(link for link in _docs_links(README.read_text()) if not (ROOT / link).is_file())
    assert not gone, f"README links docs pages that do not exist: {gone}"


def test_every_docs_page_is_in_the_readme_index():
    linked = _docs_links(README.read_text())
    unlinked = sorted(f"docs/{p.name}" for p in DOCS.glob("*.md") if f"docs/{p.name}" not in linked)
    assert not unlinked, f"docs pages missing from README's index (one line each): {unlinked}"


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def _broken_links(page: Path) -> list[str]:
    """Links from `page` to a markdown file that does not exist, or to a heading that file does not have."""
    broken = []
    for target, anchor in re.findall(r"\]\(([\w./-]+\.md)(?:#([\w-]*))?\)", page.read_text()):
        path = (page.parent / target).resolve()
        if not path.is_file() or (anchor and anchor not in _anchors(path)):
            broken.append(f"{target}#{anchor}" if anchor else target)
    return broken


GENERATED = {"docs/configuration.md", "docs/files.md", "docs/search-r1-keys.md"}
# not the repository's own pages: hidden folders (.venv, caches), runs/ (reports a run writes) and wandb/
SKIPPED_DIRS = {"runs", "wandb", "build"}


def _markdown_files(folder: Path):
    """Every `.md` file under `folder`, not descending into hidden folders or those in SKIPPED_DIRS."""
    for path in sorted(folder.iterdir()):
        if path.is_dir():
            if not path.name.startswith(".") and path.name not in SKIPPED_DIRS:
                yield from _markdown_files(path)
        elif path.suffix == ".md":
            yield path


def _hand_written() -> dict[str, int]:
    """The hand-written Markdown and its sizes: every `.md` file of the repository (README.md, `docs/*.md` and each
    package's README.md) less the pages `update_docs.py` or `sr1 config search-r1-keys` write (their generated block,
    or the whole page, follows the code) and `docs/measurements/`, where dated records of what was measured live."""
    pages = (str(p.relative_to(ROOT)) for p in _markdown_files(ROOT))
    return {
        page: len((ROOT / page).read_bytes())
        for page in pages
        if page not in GENERATED and not page.startswith("docs/measurements/")
    }


@pytest.mark.parametrize("page", sorted({*_hand_written(), *GENERATED}))
def test_links_to_pages_and_headings_resolve(page):
    broken = _broken_links(ROOT / page)
    assert not broken, f"{page} links pages or headings that do not exist: {broken}"


def test_every_file_has_its_line():
    block = _generated("docs/files.md")
    missing = [f for f in _update_docs().listed_files() if f"\n{f} " not in block and f"\n{f}\n" not in block]
    assert not missing, f"docs/files.md lacks {missing}: run `python scripts/update_docs.py`"


def test_the_file_tree_names_no_file_that_is_gone():
    block = _generated("docs/files.md").strip().removeprefix("```").removesuffix("```")
    named = [line.split()[0] for line in block.splitlines() if line.strip()]
    gone = [f for f in named if not (ROOT / f).exists()]
    assert not gone, f"docs/files.md names files that no longer exist: {gone}"


def test_the_configuration_reference_documents_every_field():
    from config.cli import reference_rows

    block = _generated("docs/configuration.md")
    missing = [key for key, _, _, _ in reference_rows() if f"| `{key}` |" not in block]
    assert not missing, f"docs/configuration.md lacks {missing}: run `python scripts/update_docs.py`"


def test_the_configuration_reference_names_no_field_that_is_gone():
    from config.cli import reference_rows

    keys = {key for key, _, _, _ in reference_rows()}
    named = re.findall(r"^\| `([^`]+)` \|", _generated("docs/configuration.md"), flags=re.MULTILINE)
    gone = [key for key in named if key not in keys]
    assert not gone, f"docs/configuration.md documents fields that no longer exist: {gone}"


def test_a_page_without_its_markers_is_refused_with_the_page_named():
    module = _update_docs()
    with pytest.raises(SystemExit, match="docs/x.md: the generated block's markers are missing"):
        module.updated("docs/x.md", "# x\n\nno block here\n", "| key |")


PAGE_LIMIT = 12 * 1024
TOTAL_LIMIT = 150 * 1024


def test_the_count_takes_in_the_package_readmes_and_leaves_out_measurements():
    pages = _hand_written()
    missing = [p for p in ("README.md", "docs/architecture.md", "weight_sync/README.md") if p not in pages]
    counted = [p for p in pages if p in GENERATED or p.startswith(("docs/measurements/", "runs/", "."))]
    assert not missing and not counted, f"the size count lacks {missing} or counts {counted}"


def test_every_hand_written_page_is_at_most_12_kb():
    over = {page: size - PAGE_LIMIT for page, size in _hand_written().items() if size > PAGE_LIMIT}
    assert not over, "pages over 12 KB (bytes over): " + ", ".join(
        f"{p} by {n}" for p, n in sorted(over.items())
    )


def test_the_hand_written_pages_together_are_at_most_150_kb():
    sizes = _hand_written()
    total = sum(sizes.values())
    largest = ", ".join(f"{p} {n}" for p, n in sorted(sizes.items(), key=lambda kv: -kv[1])[:5])
    assert total <= TOTAL_LIMIT, (
        f"the hand-written Markdown is {total} bytes, {total - TOTAL_LIMIT} over 150 KB: cut repetition and move "
        f"measurement narratives to docs/measurements/ (largest: {largest})"
    )
