"""scripts/bench/bench_retrieval.py --curve: requests/s against concurrent clients for the naive and the batched server,
in the form `sr1 plan --retrieval-bench` reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sr1.plan.measured import with_retrieval_bench
from sr1.plan.profile import load_profile, validate_profile
from tests.timing import scaled

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "bench" / "bench_retrieval.py"


def test_bad_concurrency_levels_are_refused_before_anything_starts():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--curve", "4,2"], capture_output=True, text=True, timeout=scaled(60)
    )
    assert done.returncode == 2
    assert "--curve '4,2': expected distinct, increasing concurrencies >= 1" in done.stderr


@pytest.mark.slow
@pytest.mark.long  # two retrieval servers under a concurrency sweep
def test_the_curve_of_both_bm25_servers_feeds_the_planner(tmp_path):
    """Two real BM25 servers over a 500-passage corpus, 1 and 4 clients each (about 20 s)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--curve", "1,4", "--methods", "bm25", "--passages", "500"]
        + ["--duration", "0.5", "--json", "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    curves = report["retrieval_curves"]
    assert set(curves) == {"bm25/naive", "bm25/batched"}
    for points in curves.values():
        assert [c for c, _ in points] == [1, 4] and all(rate > 0 for _, rate in points)
    assert report["date"] and report["machine"]
    bench = tmp_path / "retrieval.json"
    bench.write_text(done.stdout)
    data = with_retrieval_bench(json.loads(load_profile("cpu-tiny").model_dump_json()), bench, "bm25/naive")
    profile = validate_profile(data, "test")
    assert profile.retrieval.requests_per_s.points == [tuple(map(float, p)) for p in curves["bm25/naive"]]
