"""Does a micro-batch of `learner.micro_batch_tokens` fit on the GPU? An estimate of the step's peak memory, checked
when the learner is built, so a budget that cannot fit fails before the first step, naming the budget that would.

    peak = step_peak_bytes(StepShape.of(model.config, parameters), tokens=16384, world_size=8, ...)
    check_micro_batch_fits(...)          # raises ValueError when the estimate exceeds the device's memory

The model of the peak (per rank, FSDP2 with each decoder layer a unit, the chunked log-prob head):
- static: fp32 parameter shards, their gradients and AdamW's two moments (16 bytes per parameter / world size; 0 on
  the GPU with cpu_offload), the frozen reference's fp32 shards (4 bytes), the critic's like the policy's; two
  unsharded decoder layers (the one computing and the one prefetched) and the root unit (embeddings, LM head) in the
  compute dtype;
- resident activations, per token: what autograd keeps for every layer (a layer's input only, with gradient
  checkpointing);
- the larger of two transients: the chunked head's two [chunk x vocab] fp32 buffers plus the head's fp32 gradient,
  or, with checkpointing, one layer's recomputed activations.
Per layer and token the saved activations are the two RMSNorms' fp32 inputs (8h bytes) plus, in the compute dtype,
the norms' outputs, q/k/v, the attention output and the MLP's gate, up, activation and product (4h + 2 kv + 4 I
elements). Against the peaks measured on one H100 80GB at 16,384 tokens (bf16, Qwen2.5 shapes: 0.5B without
checkpointing 30.9 GiB, 1.5B with 25.8, 3B with 49.7) this estimate is within 6 % (tests/unit/learner/test_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class StepShape:
    """What the estimate needs to know about the model."""

    parameters: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @classmethod
    def of(cls, config, parameters: int) -> StepShape | None:
        """From a transformers decoder config; None when it lacks a field the estimate needs."""
        fields = {
            "hidden": "hidden_size",
            "intermediate": "intermediate_size",
            "layers": "num_hidden_layers",
            "heads": "num_attention_heads",
            "vocab": "vocab_size",
        }
        values = {name: getattr(config, attr, None) for name, attr in fields.items()}
        if any(not isinstance(v, int) for v in values.values()):
            return None
        kv_heads = getattr(config, "num_key_value_heads", None) or values["heads"]
        return cls(parameters=parameters, kv_heads=kv_heads, **values)


@dataclass(frozen=True)
class StepMemory:
    """The estimate's parts, in bytes: peak(tokens) = static + resident * tokens + max(head, layer * tokens)."""

    static: float
    resident_per_token: float
    head_transient: float
    layer_transient_per_token: float

    def peak(self, tokens: int) -> float:
        return (
            self.static
            + self.resident_per_token * tokens
            + max(self.head_transient, self.layer_transient_per_token * tokens)
        )

    def tokens_that_fit(self, capacity: float) -> int:
        """The largest micro-batch whose estimated peak stays within `capacity` bytes (0 if none)."""
        room = capacity - self.static
        by_head = (room - self.head_transient) / self.resident_per_token
        by_layer = room / (self.resident_per_token + self.layer_transient_per_token)
        return max(0, int(min(by_head, by_layer)))


def step_memory(
    shape: StepShape,
    *,
    world_size: int,
    compute_bytes: int,
    checkpointing: bool,
    cpu_offload: bool,
    chunk_tokens: int,
    reference: bool = False,
    critic: bool = False,
) -> StepMemory:
    """The parts of one rank's peak during the policy's forward/backward (see the module docstring)."""
    h, c = shape.hidden, compute_bytes
    kv = h // shape.heads * shape.kv_heads
    per_layer = 8 * h + c * (4 * h + 2 * kv + 4 * shape.intermediate)
    layer_params = h * (h + 2 * kv) + h * h + 3 * h * shape.intermediate
    sharded = 0.0 if cpu_offload else (16 + 4 * reference + 16 * critic) * shape.parameters / world_size
    unsharded = 2 * layer_params * c + shape.vocab * h * c
    return StepMemory(
        static=sharded + unsharded,
        resident_per_token=shape.layers * (c * h if checkpointing else per_layer),
        head_transient=2 * chunk_tokens * shape.vocab * 4 + shape.vocab * h * 4,
        layer_transient_per_token=per_layer if checkpointing else 0.0,
    )


def check_micro_batch_fits(
    memory: StepMemory, tokens: int, capacity: float, device_name: str, checkpointing: bool
) -> None:
    """Raise ValueError, naming the budget that would fit, when `tokens` cannot fit in `capacity` bytes."""
    estimate = memory.peak(tokens)
    if estimate <= capacity:
        return
    fit = memory.tokens_that_fit(capacity)
    advice = (
        f"set learner.micro_batch_tokens <= {fit}"
        if fit > 0
        else "the weights and optimizer state alone do not fit: add learner ranks or set learner.cpu_offload"
    )
    raise ValueError(
        f"learner.micro_batch_tokens ({tokens}) does not fit on {device_name} ({capacity / GIB:.1f} GiB): the "
        f"step's peak is estimated at {estimate / GIB:.1f} GiB ({memory.static / GIB:.1f} GiB of weights, "
        f"gradients and optimizer state, the rest activations); {advice}"
        + ("" if checkpointing else ", or turn on learner.gradient_checkpointing")
    )
