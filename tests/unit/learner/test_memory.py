"""The micro-batch memory estimate: close to the peaks measured on an H100, and a clear error naming the budget that
fits when the configured one cannot."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from learner.memory import GIB, StepShape, check_micro_batch_fits, step_memory

# Qwen2.5 shapes (parameters, hidden, intermediate, layers, heads, kv heads) and the learner's peak measured on one
# H100 80GB at micro_batch_tokens 16384, bf16, train mode (0.5B without gradient checkpointing)
MEASURED = [
    (StepShape(494_032_768, 896, 4864, 24, 14, 2, 151_936), False, 30.9),
    (StepShape(1_543_714_304, 1536, 8960, 28, 12, 2, 151_936), True, 25.8),
    (StepShape(3_085_938_688, 2048, 11008, 36, 16, 2, 151_936), True, 49.7),
]


def _memory(shape, checkpointing, **overrides):
    settings = dict(
        world_size=1, compute_bytes=2, checkpointing=checkpointing, cpu_offload=False, chunk_tokens=1024
    )
    return step_memory(shape, **(settings | overrides))


@pytest.mark.parametrize(("shape", "checkpointing", "measured_gib"), MEASURED)
def test_estimate_is_close_to_the_measured_peaks(shape, checkpointing, measured_gib):
    assert _memory(shape, checkpointing).peak(16384) / GIB == pytest.approx(measured_gib, rel=0.10)


def test_offload_sharding_and_checkpointing_shrink_the_estimate():
    shape = MEASURED[2][0]
    full = _memory(shape, False).peak(16384)
    assert _memory(shape, True).peak(16384) < full
    assert _memory(shape, False, world_size=8).peak(16384) < full
    offloaded = _memory(shape, True, cpu_offload=True).peak(16384)
    assert offloaded < 12 * GIB  # no sharded state on the GPU
    assert _memory(shape, False, reference=True).peak(16384) > full


def test_a_budget_that_cannot_fit_fails_naming_one_that_does():
    shape, checkpointing, _ = MEASURED[2]
    memory = _memory(shape, checkpointing)
    capacity = 80 * GIB
    fit = memory.tokens_that_fit(capacity)
    assert memory.peak(fit) <= capacity < memory.peak(int(fit * 1.01) + 1)
    check_micro_batch_fits(memory, fit, capacity, "H100", checkpointing)  # fits: no error
    with pytest.raises(
        ValueError, match=rf"micro_batch_tokens \(500000\) does not fit on H100 \(80.0 GiB\).*<= {fit}"
    ):
        check_micro_batch_fits(memory, 500_000, capacity, "H100", checkpointing)
    # without checkpointing the message says so; with a GPU too small for the weights it says what helps
    with pytest.raises(ValueError, match="turn on learner.gradient_checkpointing"):
        check_micro_batch_fits(_memory(shape, False), 500_000, capacity, "H100", False)
    with pytest.raises(ValueError, match="weights and optimizer state alone do not fit"):
        check_micro_batch_fits(memory, 1024, 16 * GIB, "a small GPU", checkpointing)


def test_shape_of_a_transformers_config(tiny_model_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    shape = StepShape.of(config, 1000)
    assert shape.hidden == config.hidden_size and shape.kv_heads == config.num_key_value_heads
    assert (
        StepShape.of(SimpleNamespace(hidden_size=64, num_hidden_layers=2), 1000) is None
    )  # not a decoder it knows
