"""The map in learner/__init__.py names every module of learner/, root and wings, and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import learner

ROOT = Path(learner.__file__).resolve().parent
# A map line: a module ("loop.py") or a package ("execution/"), indented under its package, then what it is for.
LINE = re.compile(r"^(?P<indent> *)(?P<name>[a-z_0-9]+(?:\.py|/))  +\S")


def map_entries(doc: str) -> list[str]:
    """The paths the map names, relative to learner/: "loop.py", "execution/", "execution/plan.py"."""
    entries: list[str] = []
    package = ""
    for line in doc.splitlines():
        found = LINE.match(line)
        if not found:
            continue
        name = found["name"]
        if not found["indent"]:
            package = name if name.endswith("/") else ""
            entries.append(name)
        elif not package:
            raise AssertionError(f"map line {line.strip()!r} is indented under no package line")
        else:
            entries.append(package + name)
    return entries


def modules_on_disk() -> set[str]:
    """Every module and package under learner/, as the map names them (no __init__.py: its package stands for it)."""
    found = set()
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        if "__pycache__" in relative.parts or relative == Path("__init__.py"):
            continue
        if path.name == "__init__.py":
            found.add(relative.parent.as_posix() + "/")
        else:
            found.add(relative.as_posix())
    return found


def test_the_map_names_every_module_of_the_learner():
    missing = sorted(modules_on_disk() - set(map_entries(learner.__doc__)))
    assert not missing, (
        f"learner/__init__.py's map has no line for {missing}: add one each, where a reader meets it"
    )


def test_the_map_names_no_module_that_is_gone_and_none_twice():
    entries = map_entries(learner.__doc__)
    gone = sorted(set(entries) - modules_on_disk())
    assert not gone, f"learner/__init__.py's map names {gone}, which learner/ does not have"
    twice = sorted({entry for entry in entries if entries.count(entry) > 1})
    assert not twice, f"learner/__init__.py's map names {twice} more than once"


def test_a_line_indented_under_no_package_is_refused_with_the_line_named():
    with pytest.raises(AssertionError, match="plan.py"):
        map_entries("loop.py     the loop\n  plan.py   the plan\n")
