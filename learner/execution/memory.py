"""How much GPU memory a learner step takes, and the cheapest way to run it that fits: the estimate of one rank's
peak, the activation-checkpointing policy `auto` picks from it, and the check that fails at start, naming the
budget that would fit, when nothing does.

    shape = StepShape.of(model.config, parameters)
    plan = plan_memory(shape, MemorySettings(world_size=6, compute_bytes=2, tokens=16384, ...), capacity)
    plan.checkpointing, plan.keep_unsharded, plan.defer_grad_sync, plan.estimate   # logged by the learner
    estimate_peak_bytes(config, parameters, world_size=1, dtype="bfloat16", checkpointing="none", ...)  # the bench

The model of the peak (per rank, FSDP2 with each decoder layer a unit, the chunked or fused log-prob head):
- static: fp32 parameter shards, their gradients and AdamW's two moments (16 bytes per parameter / world size; 0 on
  the GPU with cpu_offload), the frozen reference's fp32 shards (4 bytes), the critic's like the policy's (with
  `learner.lora`: the frozen base's shards in the compute dtype, 16 bytes per adapter parameter, no reference copy
  and no head gradient; the adapters' r-wide activations, under 1 % of a layer's for r <= 64, are left out); unsharded
  parameters in the compute dtype: two decoder layers (the one computing and the one prefetched) and the root unit
  (embeddings, LM head), or every layer when they stay unsharded through the update (`keep_unsharded`); with
  gradient sync deferred to an update's last micro-batch on several ranks, FSDP2's unsharded fp32 gradient
  accumulators (4 bytes per parameter, not divided by the ranks);
- resident activations, per token and layer, by how the layer runs (`layer_activation_bytes`);
- the larger of two transients: the log-prob head's [chunk x vocab] buffers (two fp32 ones for the chunked head,
  two in the compute dtype for the fused one) plus its weight gradient (fp32; the fused head's in the compute dtype,
  with an fp32 [tokens x hidden] gradient beside it), or one checkpointed layer's recomputed activations.
Per layer and token (h hidden, kv the K/V width, I the MLP width, H heads, c compute bytes), what autograd keeps:
- eager, no checkpointing: the two RMSNorms' fp32 inputs (8h) and, in the compute dtype, the norms' outputs, q/k/v,
  the attention output and the MLP's gate, up, activation and product: 8h + c(4h + 2kv + 4I). Against the peaks
  measured on one H100 80GB at 16,384 tokens (bf16, Qwen2.5 0.5B without checkpointing 30.9 GiB, 1.5B and 3B with
  25.8 and 49.7) the estimate is within 6 % (tests/unit/learner/test_memory.py);
- compiled (torch.compile's partitioner recomputes the pointwise ops in the backward): the layer's input and the
  residual, the norms' outputs, q/k/v, the attention output with its log-sum-exp, gate, up and their product:
  c(5h + 2kv + 3I) + 4H;
- selective (matmul and attention outputs saved, the rest recomputed): c(4h + 2kv + 2I) + 4H eager, one h less
  compiled;
- full: the layer's input, c h; the backward recomputes one layer at a time (the transient above).
On CPU the eager terms are checked against the tensors a real bf16 layer's forward leaves alive
(tests/unit/learner/test_memory.py): none 10 % above them (SDPA's CPU path keeps K and V repeated to every query
head), selective 4 % above.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 2**30
# the policies, cheapest recompute first; `auto` tries them in this order (every_n with N = 2)
POLICIES = ("none", "selective", "every_n", "full")
AUTO_EVERY = 2
# auto keeps this share of the GPU free of its estimate: the allocator's fragmentation, cuBLAS/NCCL workspaces
AUTO_HEADROOM = 0.90


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
    def of(cls, config, parameters: int | None = None) -> StepShape | None:
        """From a transformers decoder config (parameters counted from it when not given); None when it lacks a field
        the estimate needs."""
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
        shape = cls(parameters=parameters or 0, kv_heads=kv_heads, **values)
        if parameters is None:
            untied = not getattr(config, "tie_word_embeddings", True)
            shape = replace(shape, parameters=shape.counted_parameters(untied_head=untied))
        return shape

    @property
    def kv(self) -> int:
        """The width of K (and of V): heads' dimension x K/V heads."""
        return self.hidden // self.heads * self.kv_heads

    @property
    def layer_parameters(self) -> int:
        """One decoder layer's parameters (q/k/v with biases, o, the gated MLP, two norms)."""
        h, kv = self.hidden, self.kv
        return h * (h + 2 * kv) + (h + 2 * kv) + h * h + 3 * h * self.intermediate + 2 * h

    def counted_parameters(self, untied_head: bool = False) -> int:
        """Parameters of a Qwen2-like decoder of this shape (exact for Qwen2.5, whose head is tied)."""
        embeddings = self.vocab * self.hidden * (2 if untied_head else 1)
        return self.layers * self.layer_parameters + embeddings + self.hidden


def layer_activation_bytes(shape: StepShape, compute_bytes: int, mode: str, compiled: bool) -> float:
    """Bytes per token that one decoder layer keeps for its backward: mode `none`, `selective` or `full` (see the
    module docstring)."""
    h, kv, inter, c = shape.hidden, shape.kv, shape.intermediate, compute_bytes
    lse = 4 * shape.heads  # the attention's fp32 log-sum-exp, per head
    if mode == "full":
        return c * h
    if mode == "selective":
        return c * ((3 if compiled else 4) * h + 2 * kv + 2 * inter) + lse
    if mode != "none":
        raise ValueError(f"layer mode {mode!r} is not one of none, selective, full")
    if compiled:
        return c * (5 * h + 2 * kv + 3 * inter) + lse
    return 8 * h + c * (4 * h + 2 * kv + 4 * inter)


def checkpointed_layers(policy: str, layers: int, every: int) -> list[str]:
    """How each decoder layer runs under a policy: `full` (checkpointed), `selective` or `none`. every_n checkpoints
    layers 0, N, 2N, ... and runs the others without recompute."""
    if policy == "every_n":
        return ["full" if i % every == 0 else "none" for i in range(layers)]
    if policy in ("full", "selective", "none"):
        return [policy] * layers
    raise ValueError(f"checkpointing policy {policy!r} is not one of {', '.join(POLICIES)}")


@dataclass(frozen=True)
class MemorySettings:
    """How the step runs, as far as memory goes."""

    world_size: int = 1
    compute_bytes: int = 2
    tokens: int = 16384  # learner.micro_batch_tokens
    chunk_tokens: int = 1024  # learner.logprob_chunk_tokens
    checkpointing: str = "none"
    every: int = AUTO_EVERY
    compiled: bool = False
    fused_head: bool = False
    cpu_offload: bool = False
    reference: bool = False
    critic: bool = False
    keep_unsharded: bool = False  # every layer's compute-dtype parameters stay through the update
    lora_parameters: int = (
        0  # learner.lora: the adapters' parameters (the base is frozen in the compute dtype)
    )
    defer_grad_sync: bool = False  # FSDP2's unsharded fp32 accumulators (several ranks and micro-batches)


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


def memory_of(shape: StepShape, settings: MemorySettings) -> StepMemory:
    """The parts of one rank's peak during the policy's forward/backward (see the module docstring)."""
    s, c, h = settings, settings.compute_bytes, shape.hidden
    modes = checkpointed_layers(s.checkpointing, shape.layers, s.every)
    params, lora = shape.parameters, s.lora_parameters
    # the policy's state: every weight trained (16 bytes each), or with LoRA the frozen base in the compute dtype
    # and the adapters trained; the critic beside it like a full policy; the reference a frozen fp32 copy
    policy = c * params + 16 * lora if lora else 16 * params
    state = policy + 16 * params * s.critic + 4 * params * s.reference
    sharded = 0.0 if s.cpu_offload else state / s.world_size
    layers_unsharded = shape.layers if s.keep_unsharded else 2
    unsharded = layers_unsharded * shape.layer_parameters * c + shape.vocab * h * c
    trained = (lora or params) + params * s.critic
    accumulators = 4 * trained if s.defer_grad_sync and s.world_size > 1 else 0.0
    resident = sum(layer_activation_bytes(shape, c, mode, s.compiled) for mode in modes)
    recompute = layer_activation_bytes(shape, c, "none", s.compiled) if "full" in modes else 0.0
    head_grad = 0 if lora else 1  # LoRA leaves the head frozen: no weight gradient
    if (
        s.fused_head
    ):  # compute-dtype logits and their gradient, a chunk's worth at a time; the weight's gradient in
        # the compute dtype, the hidden states' in fp32
        head = 2 * s.chunk_tokens * shape.vocab * c + head_grad * shape.vocab * h * c + s.tokens * h * 4
    else:  # two fp32 [chunk x vocab] buffers and the fp32 weight gradient
        head = 2 * s.chunk_tokens * shape.vocab * 4 + head_grad * shape.vocab * h * 4
    return StepMemory(
        static=sharded + unsharded + accumulators,
        resident_per_token=resident,
        head_transient=head,
        layer_transient_per_token=recompute,
    )


def step_memory(
    shape: StepShape,
    *,
    world_size: int,
    compute_bytes: int,
    checkpointing: bool | str,
    cpu_offload: bool,
    chunk_tokens: int,
    reference: bool = False,
    critic: bool = False,
    **settings,
) -> StepMemory:
    """`memory_of` with keyword settings; `checkpointing` True/False mean full/none."""
    if isinstance(checkpointing, bool):
        checkpointing = "full" if checkpointing else "none"
    return memory_of(
        shape,
        MemorySettings(
            world_size=world_size,
            compute_bytes=compute_bytes,
            checkpointing=checkpointing,
            cpu_offload=cpu_offload,
            chunk_tokens=chunk_tokens,
            reference=reference,
            critic=critic,
            **settings,
        ),
    )


def estimate_peak_bytes(
    config,
    parameters: int | None = None,
    *,
    world_size: int = 1,
    dtype: str = "bfloat16",
    checkpointing: str = "none",
    micro_batch_tokens: int = 16384,
    chunk_tokens: int = 1024,
    reference: bool = False,
    critic: bool = False,
    cpu_offload: bool = False,
    every: int = AUTO_EVERY,
    compiled: bool = False,
    fused_head: bool = False,
    keep_unsharded: bool = False,
    defer_grad_sync: bool = False,
    lora_parameters: int = 0,
) -> float:
    """One rank's estimated peak bytes for a transformers config (or a StepShape): what the GPU check compares with
    torch.cuda.max_memory_allocated. `dtype`: the compute dtype's name (model.dtype)."""
    shape = config if isinstance(config, StepShape) else StepShape.of(config, parameters)
    if shape is None:
        raise ValueError(f"the memory estimate does not know the config {type(config).__name__}")
    settings = MemorySettings(
        world_size=world_size,
        compute_bytes=COMPUTE_BYTES[dtype],
        tokens=micro_batch_tokens,
        chunk_tokens=chunk_tokens,
        checkpointing=checkpointing,
        every=every,
        compiled=compiled,
        fused_head=fused_head,
        cpu_offload=cpu_offload,
        reference=reference,
        critic=critic,
        keep_unsharded=keep_unsharded,
        defer_grad_sync=defer_grad_sync,
        lora_parameters=lora_parameters,
    )
    return memory_of(shape, settings).peak(micro_batch_tokens)


COMPUTE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MemoryPlan:
    """What `plan_memory` chose, with the numbers behind it (the learner logs `reason`)."""

    settings: MemorySettings
    estimate: float
    capacity: float
    reason: str

    @property
    def checkpointing(self) -> str:
        return self.settings.checkpointing

    @property
    def every(self) -> int:
        return self.settings.every

    @property
    def keep_unsharded(self) -> bool:
        return self.settings.keep_unsharded

    @property
    def defer_grad_sync(self) -> bool:
        return self.settings.defer_grad_sync


def plan_memory(
    shape: StepShape, settings: MemorySettings, capacity: float, *, requested: str = "auto"
) -> MemoryPlan:
    """The checkpointing policy and FSDP2 settings for a step of `settings.tokens` on a GPU of `capacity` bytes.

    `requested` auto: the least recompute (none, selective, every 2nd layer, full) whose peak fits in AUTO_HEADROOM of
    the GPU with parameters resharded and gradients synced every micro-batch; then, while the estimate still fits,
    every layer's parameters kept unsharded through the update (no re-cast or all-gather per micro-batch) and, on
    several ranks, gradient sync deferred to the update's last micro-batch. A named policy is kept as it is and only
    the FSDP2 settings are chosen. When nothing fits, the plan is the cheapest in memory (the start-up check then
    fails naming the budget that would fit)."""
    budget = capacity * AUTO_HEADROOM
    frugal = replace(settings, keep_unsharded=False, defer_grad_sync=False)
    if requested == "auto":
        candidates = [replace(frugal, checkpointing=p, every=AUTO_EVERY) for p in POLICIES]
    else:
        candidates = [replace(frugal, checkpointing=requested)]
    peaks = [memory_of(shape, c).peak(settings.tokens) for c in candidates]
    fitting = [i for i, peak in enumerate(peaks) if peak <= budget]
    chosen = candidates[fitting[0] if fitting else -1]
    tried = ", ".join(f"{c.checkpointing} {p / GIB:.1f}" for c, p in zip(candidates, peaks, strict=True))
    extras = []
    for extra in ("keep_unsharded", "defer_grad_sync"):
        if extra == "defer_grad_sync" and settings.world_size == 1:
            chosen = replace(chosen, defer_grad_sync=True)  # one rank: the accumulator is the gradient itself
            continue
        wider = replace(chosen, **{extra: True})
        if memory_of(shape, wider).peak(settings.tokens) <= budget:
            chosen, extras = wider, [*extras, extra]
    estimate = memory_of(shape, chosen).peak(settings.tokens)
    reason = (
        f"{chosen.checkpointing}{f' (every {chosen.every})' if chosen.checkpointing == 'every_n' else ''}: "
        f"estimated peak {estimate / GIB:.1f} GiB of {capacity / GIB:.1f} GiB ({AUTO_HEADROOM:.0%} usable) at "
        f"{settings.tokens} tokens on {settings.world_size} rank(s); tried (GiB, resharded) {tried}"
        + (f"; with {' and '.join(extras)}" if extras else "")
    )
    return MemoryPlan(chosen, estimate, capacity, reason)


def check_micro_batch_fits(
    memory: StepMemory, tokens: int, capacity: float, device_name: str, checkpointing: bool | str
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
    full = checkpointing is True or checkpointing == "full"
    raise ValueError(
        f"learner.micro_batch_tokens ({tokens}) does not fit on {device_name} ({capacity / GIB:.1f} GiB): the "
        f"step's peak is estimated at {estimate / GIB:.1f} GiB ({memory.static / GIB:.1f} GiB of weights, "
        f"gradients and optimizer state, the rest activations); {advice}"
        + ("" if full else ", or turn on learner.gradient_checkpointing (full)")
    )
