"""The micro-batch memory estimate: close to the peaks measured on an H100, and a clear error naming the budget that
fits when the configured one cannot."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from learner.execution.memory import GIB, StepShape, check_micro_batch_fits, step_memory

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


# -- checkpointing as a policy, chosen from the estimate --------------------------------------------------------

QWEN_3B = MEASURED[2][0]


def _plan(
    world_size: int, capacity_gib: float, requested="auto", *, compiled=True, reference=True, **overrides
):
    from learner.execution.memory import MemorySettings, plan_memory

    settings = MemorySettings(
        world_size=world_size,
        tokens=16384,
        compiled=compiled,
        fused_head=True,
        reference=reference,
        **overrides,
    )
    return plan_memory(QWEN_3B, settings, capacity_gib * GIB, requested=requested)


@pytest.mark.parametrize("compiled", [True, False])
def test_a_3b_learner_on_six_h100_ranks_does_not_recompute_every_layer(compiled):
    """Qwen2.5-3B, 6 FSDP ranks of 80 GB, 16k-token micro-batches, the reference beside it: the sharded state is
    ~10 GB a rank, so auto keeps (most) activations instead of recomputing every layer; and it says why."""
    plan = _plan(6, 80, compiled=compiled)
    assert plan.checkpointing in ("none", "selective")
    assert plan.estimate <= 0.9 * 80 * GIB
    assert "tried (GiB, resharded) none" in plan.reason and "6 rank(s)" in plan.reason


def test_an_h200_fits_3b_at_16k_without_recompute_and_an_h100_needs_full():
    assert _plan(1, 139, compiled=True).checkpointing == "none"
    # one 80 GB rank holds all 49 GB of state: only full recompute leaves room for 16k tokens of activations
    one_h100 = _plan(1, 80, compiled=True)
    assert one_h100.checkpointing == "full" and one_h100.estimate <= 0.9 * 80 * GIB
    # what does not fit anywhere is the cheapest in memory, and the start-up check then fails on it
    assert _plan(1, 40).checkpointing == "full"


def test_a_named_policy_is_kept_and_the_fsdp2_settings_follow_memory():
    plan = _plan(6, 80, "every_n", every=3)
    assert (plan.checkpointing, plan.every) == ("every_n", 3)
    named = _plan(6, 80, "full")
    assert named.checkpointing == "full" and named.keep_unsharded and named.defer_grad_sync  # room for both
    tight = _plan(6, 45)
    assert tight.checkpointing == "every_n"  # selective does not fit in 90 % of 45 GiB, every 2nd layer does
    assert (
        not tight.keep_unsharded and not tight.defer_grad_sync
    )  # neither extra fits: sync every micro-batch
    assert _plan(1, 139).defer_grad_sync  # one rank: the accumulator is the gradient itself


def test_the_policies_terms_order_as_their_recompute():
    from learner.execution.memory import layer_activation_bytes

    for compiled in (True, False):
        terms = {m: layer_activation_bytes(QWEN_3B, 2, m, compiled) for m in ("none", "selective", "full")}
        assert terms["none"] > terms["selective"] > terms["full"] == 2 * QWEN_3B.hidden
    assert layer_activation_bytes(QWEN_3B, 2, "none", True) < layer_activation_bytes(
        QWEN_3B, 2, "none", False
    )
    with pytest.raises(ValueError, match="not one of none, selective, full"):
        layer_activation_bytes(QWEN_3B, 2, "every_n", False)


def test_the_public_estimate_for_the_benchmark():
    """estimate_peak_bytes(config, ...): the calibrated estimate by default; each setting moves it the way it
    should (the unsharded layers, the accumulators on several ranks only, the reference, offload)."""
    from transformers import Qwen2Config

    from learner.execution.memory import estimate_peak_bytes

    config = Qwen2Config(
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151_936,
        tie_word_embeddings=True,
    )
    assert (
        StepShape.of(config).parameters == QWEN_3B.parameters
    )  # counted from the config: Qwen2.5-3B exactly
    base = estimate_peak_bytes(config, checkpointing="full")
    assert base == pytest.approx(_memory(QWEN_3B, True).peak(16384))
    assert base / GIB == pytest.approx(49.7, rel=0.10)
    layers = QWEN_3B.layer_parameters * QWEN_3B.layers
    kept = estimate_peak_bytes(config, checkpointing="full", keep_unsharded=True)
    assert kept - base == pytest.approx((layers - 2 * QWEN_3B.layer_parameters) * 2)  # all layers, not two
    assert estimate_peak_bytes(config, checkpointing="full", defer_grad_sync=True) == base  # one rank
    four = dict(world_size=4, checkpointing="full")
    deferred = estimate_peak_bytes(config, defer_grad_sync=True, **four) - estimate_peak_bytes(config, **four)
    assert deferred == pytest.approx(4 * QWEN_3B.parameters)
    assert estimate_peak_bytes(config, checkpointing="full", reference=True) > base
    assert estimate_peak_bytes(config, checkpointing="full", cpu_offload=True) < 12 * GIB


def _kept_per_token(mode: str) -> dict:
    """What one bf16 decoder layer (hidden 256, MLP 1024, 4 heads, 2 K/V heads) keeps for its backward, per token:
    the bytes of every tensor its forward created that is still alive after it (the output aside), between 1,024 and
    3,072 tokens (the slope: per-call constants cancel). Counted from the tensors themselves, not from the process's
    memory, so the figure is the same on every CPU and allocator."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    from learner.execution.recompute import checkpointed_forward

    class Created(TorchDispatchMode):  # every storage an op in the forward returns, held weakly
        def __init__(self):
            super().__init__()
            self.storages = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    self.storages.append((StorageWeakRef(storage), storage.data_ptr(), storage.nbytes()))
            return out

    config = Qwen2Config(
        hidden_size=256,
        intermediate_size=1024,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=1,
        vocab_size=16,
    )
    config._attn_implementation = "sdpa"
    layer = Qwen2DecoderLayer(config, 0).to(torch.bfloat16)
    forward = checkpointed_forward(layer.forward, mode)

    def kept(tokens: int) -> int:
        x = torch.randn(1, tokens, 256, dtype=torch.bfloat16)
        position_ids = torch.arange(tokens)[None]
        cos, sin = (t.to(torch.bfloat16) for t in Qwen2RotaryEmbedding(config)(x, position_ids))
        x.requires_grad_()
        created = Created()
        with created:
            y = forward(x, position_embeddings=(cos, sin), position_ids=position_ids)
        y = y[0] if isinstance(y, tuple) else y
        gc.collect()
        output = y.untyped_storage().data_ptr()
        alive = {ptr: n for ref, ptr, n in created.storages if not ref.expired() and ptr != output}
        y.float().sum().backward()
        return sum(alive.values())

    return (kept(3072) - kept(1024)) / 2048


def test_the_activation_terms_are_what_autograd_keeps():
    """The estimate's per-layer terms for eager none and selective against what a real layer keeps after its forward:
    none 10 % above the terms (SDPA's CPU path keeps K and V repeated to every query head, which GPU kernels do not),
    selective 4 % above, so within 12 %; and full keeping next to nothing (its input was made before the forward)."""
    from learner.execution.memory import layer_activation_bytes

    shape = StepShape(0, 256, 1024, 1, 4, 2, 16)
    measured = {mode: _kept_per_token(mode) for mode in ("none", "selective", "full")}
    for mode in ("none", "selective"):
        assert measured[mode] == pytest.approx(layer_activation_bytes(shape, 2, mode, False), rel=0.12), (
            measured
        )
    assert measured["full"] < 0.1 * measured["none"], measured
