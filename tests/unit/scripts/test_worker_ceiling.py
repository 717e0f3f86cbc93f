"""`bench_generators.py --null-engine`, briefly: a worker over the null engine at two small concurrencies gives
non-zero figures, batches what it is asked to, and every group it put comes back well formed, with versions that
changed mid-run. No timing is asserted (the machine is shared)."""

from __future__ import annotations

import json

import pytest

from scripts.bench import bench_generators
from tests.timing import scaled


@pytest.mark.slow
@pytest.mark.long  # the benchmark's whole run
def test_the_null_engine_bench_reports_sane_figures_and_well_formed_trajectories(
    qwen_tokenizer_dir, tmp_path, capsys
):
    argv = [
        "--null-engine",
        "--concurrency",
        "8,16",
        # long enough for trajectories to finish on this machine now (a fixed 1 s saw none on a loaded VM)
        "--seconds",
        str(scaled(1)),
        "--warmup-s",
        str(scaled(0.5)),
        "--publish-every-s",
        "0.3",
        "--cpu-core",
        "-1",  # not the test process: it runs in it
        "--tokenizer",
        str(qwen_tokenizer_dir),
        "--cache",
        str(tmp_path / "null-model"),
        "--json",
        "generators.group_size=4",
    ]
    assert bench_generators.main(argv) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [p["sequences"] for p in figures["null_engine"]] == [8, 16]
    for point in figures["null_engine"]:
        worker, frontend = point["worker"], point["frontend"]
        for phase in (worker, frontend):
            assert phase["tokens_per_s"] > 0 and phase["tokens_per_cpu_s"] > 0 and phase["turns_per_s"] > 0
            assert 0 < phase["sequences_per_step"] <= point["sequences"]
        assert worker["publishes"] >= 1 and worker["trajectories_per_s"] > 0 and worker["searches_per_s"] > 0
        check = worker["trajectory_check"]
        assert check["groups"] > 0 and check["trajectories"] == 4 * check["groups"]
        assert check["turns_per_trajectory"] >= 1 and check["sampled_tokens_per_turn"] > 5
        assert check["trajectories_across_a_publish"] > 0
        assert set(check["finish_reasons"]) <= {"answer", "max_turns", "budget"}
    assert figures["workload"]["tokens_per_turn"] > 0 and figures["cpu"]
