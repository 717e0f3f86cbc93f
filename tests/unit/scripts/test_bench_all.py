"""scripts/bench/bench_all.py: the range it reports is over every round, and a failed round is counted, not hidden."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bench_all():
    from scripts.bench import bench_all

    return bench_all


def test_the_table_gives_the_lowest_and_highest_round_and_counts_failures(bench_all):
    rounds = [
        {
            "buffer": {"ratio_ours_vs_raw": 0.71},
            "logprob_memory": {"sizes": [{"peak_ratio_chunked_over_unchunked": 0.24}]},
        },
        {"buffer": {"ratio_ours_vs_raw": 0.64}},
        {"buffer": {"error": "exit 1: redis-server not found"}},
    ]
    text = bench_all.table(rounds, {"date": "2026-11-24", "CPU": "test"})
    row = next(line for line in text.splitlines() if line.startswith("| buffer put->take->ack"))
    assert "| 0.64 | 0.71 | 0.71, 0.64 (1 failed) |" in row
    peak = next(line for line in text.splitlines() if "2,048 tokens at vocab" in line)
    assert "| 0.24 | 0.24 |" in peak
    assert "- date: 2026-11-24" in text
    assert "generators" not in text  # a benchmark no round ran has no row


def test_every_figure_names_a_key_its_script_prints(bench_all):
    for name, (argv, figures) in bench_all.BENCHMARKS.items():
        script = (ROOT / argv[0]).read_text()
        assert "--json" in argv, name
        for path, _ in figures.values():
            # ratio_qps_c128_1_worker is printed as f"ratio_qps_c{top}_1_worker": the parts between numbers
            parts = [part for part in re.split(r"\d+", path.split(".")[-1]) if len(part) > 1]
            assert all(part in script for part in parts), (name, path)
