"""`scripts/bench/bench_update_pause.py`'s adapter sizes for Qwen2.5-3B and 7B agree with the learner's own count
(`learner.lora.lora_parameters`), so the benchmark's bytes per update and docs/lora.md's table cannot drift."""

from __future__ import annotations

import pytest

from learner.lora import lora_parameters
from learner.settings import LoraSettings


@pytest.mark.parametrize("rank", [16, 64])
def test_the_bench_counts_adapter_parameters_as_the_learner_does(rank):
    from scripts.bench import bench_update_pause as bench

    for name, (hidden, inter, layers, heads, kv_heads, params) in bench.QWEN_SHAPES.items():
        expected = lora_parameters(hidden, kv_heads * hidden // heads, inter, layers, LoraSettings(rank=rank))
        sizes = bench.computed_sizes(rank)[name]
        assert sizes["adapter_params"] == expected, name
        assert sizes["full_bf16_bytes"] == 2 * params
    assert bench.computed_sizes(16)["Qwen2.5-3B"]["adapter_params"] == 29_933_568
