"""The README's "Files" section names every file of the repository (`python scripts/update_readme.py` prints it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_files():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_file_has_its_line():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Files") :]
    missing = [
        f for f in _readme_files().listed_files() if f"\n{f} " not in section and f"\n{f}\n" not in section
    ]
    assert not missing, f"README's Files section lacks {missing}: run `python scripts/update_readme.py`"


def test_the_files_section_names_no_file_that_is_gone():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Files") :]
    block = section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n") + 4)]
    named = [line.split()[0] for line in block.splitlines() if line.strip()]
    gone = [f for f in named if not (ROOT / f).exists()]
    assert not gone, f"README's Files section names files that no longer exist: {gone}"
