"""`scripts/bench/bench_warmstart_transfer.py`: a new seed's policy from the shipped one (its tokenizer, or renamed
rows) and from a random init, each trained with the warm start's loop and probed; bad arguments are refused before
any work. Only what is exact is asserted (step counts, figures being shares, the shares line), never timings or EM."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "bench_warmstart_transfer.py"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=380)


def test_each_start_is_trained_and_probed_and_compared_with_the_scratch_build():
    proc = run("--seed", "101", "--epochs", "0", "1", "--scratch", "--questions", "2", "--trajectories", "32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # another seed's words are not single tokens of the shipped tokenizer: why the renamed start exists
    counts = re.search(r"first names ([\d.]+), last names ([\d.]+), cities ([\d.]+)", proc.stdout)
    assert counts and all(float(n) > 1.5 for n in counts.groups()), proc.stdout
    rows = [
        [c.strip() for c in line.split("|")[1:-1]]
        for line in proc.stdout.splitlines()
        if line.startswith("| ")
    ]
    assert rows[0][0] == "start"
    # 32 trajectories in batches of 16: 2 steps an epoch; the scratch build's 20 epochs
    expected = [
        ("shipped tokenizer", 0, 0),
        ("shipped tokenizer", 1, 2),
        ("renamed", 0, 0),
        ("renamed", 1, 2),
    ]
    assert [(r[0], int(r[1]), int(r[2])) for r in rows[1:]] == expected + [("scratch", 20, 40)]
    assert all(len(r) == 9 and all(0.0 <= float(x) <= 1.0 for x in r[4:]) for r in rows[1:])
    assert re.search(r"share of the scratch build's: 0 epochs [\d.]+, 1 epochs [\d.]+$", proc.stdout.strip())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "0"], "--seed must not be 0"),
        (["--epochs", "-1"], "--epochs must be >= 0"),
        (["--trajectories", "0"], "--trajectories >= 1"),
    ],
)
def test_bad_arguments_are_refused(args, message):
    proc = run(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
