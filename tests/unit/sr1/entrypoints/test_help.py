"""Every process's entry point answers `--help` without importing the heavy libraries (they load once it runs)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sr1 import entrypoints

HEAVY = ("torch", "vllm", "transformers", "ray", "faiss", "sentence_transformers")

# run the module as `python -m` would, then list the heavy libraries it imported on the way to its usage text
_PROBE = """
import json, runpy, sys
sys.argv = [sys.argv[1], "--help"]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "heavy": sorted(m for m in sys.modules if m.split(".")[0] in %r)}))
"""


@pytest.mark.parametrize("module", [entrypoints.LEARNER, entrypoints.GENERATORS, entrypoints.RETRIEVAL])
def test_help_answers_without_the_heavy_libraries(module):
    out = subprocess.run(
        [sys.executable, "-c", _PROBE % (HEAVY,), module], capture_output=True, text=True, check=True
    )
    usage, _, last = out.stdout.rstrip().rpartition("\n")
    result = json.loads(last)
    assert result["code"] == 0 and "usage:" in usage, out.stdout + out.stderr
    assert result["heavy"] == [], f"{module} --help imported {result['heavy']}"
