"""Every Python example in the docs runs: each ```python block of README.md, docs/ and the packages' READMEs is
executed as it is, so an example cannot drift from the code it shows.

A block is self-contained (its own imports) and may use `redis_url`, the address of a live Redis started for the
test; its own `assert`s say what it shows. Anything else that only sketches code belongs in prose, not a python block.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    p
    for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *ROOT.glob("*/README.md")]
    if ".venv" not in p.parts
)
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _examples() -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            found.append((str(page.relative_to(ROOT)), line, match.group(1)))
    return found


EXAMPLES = _examples()


def test_the_docs_have_python_examples_to_run():
    assert len(EXAMPLES) >= 2, (
        f"found {len(EXAMPLES)} python blocks in {len(PAGES)} pages: is BLOCK still right?"
    )


@pytest.mark.parametrize(("page", "line", "code"), EXAMPLES, ids=[f"{p}:{n}" for p, n, _ in EXAMPLES])
def test_python_example_runs(page, line, code, redis_url):
    namespace = {"__name__": f"doc_example_{line}", "redis_url": redis_url}
    exec(compile(code, f"{page}:{line}", "exec"), namespace)
