"""`scripts/bench/bench_weight_sync.py --quick` runs end to end: both dtypes, each against its own raw broadcast."""

from __future__ import annotations

import json

import scripts.bench.bench_weight_sync as bench_weight_sync


def test_quick_benchmark_reports_both_dtypes_and_sends_fp32_in_place(capsys):
    args = ["--quick", "--skip-learner", "--json", "--rounds", "1", "--warmup", "0"]
    assert bench_weight_sync.main(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    fp32, bf16 = result["dtypes"]["float32"], result["dtypes"]["bfloat16"]
    # fp32 weights published as fp32 need no copy: every tensor of 1 MB or more goes from its own memory
    assert fp32["in_place_bytes"] > 0.9 * fp32["bytes"]
    assert bf16["in_place_bytes"] == 0  # every fp32 tensor is converted into a staging buffer
    assert abs(bf16["bytes"] - fp32["bytes"] / 2) < 0.01 * fp32["bytes"]
    for figures in (fp32, bf16):
        assert figures["publish_s"] > 0 and figures["raw_broadcast_s"] > 0
        assert figures["ratio_publish_over_raw"] == figures["raw_broadcast_s"] / figures["publish_s"]
