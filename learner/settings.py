"""The `learner` config section: the algorithm with its staleness correction, FSDP2 training, checkpoints."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from buffer.staleness import MaxStaleness
from learner.algorithms.settings import (
    AlgorithmConfig,
    CorrectionConfig,
    GRPOConfig,
    TISCorrection,
)


def _policy_of_bool(value):
    """true/false (and Search-R1's enable_gradient_checkpointing) mean the checkpointing policies full/none."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        value = value.strip().lower() == "true"
    if isinstance(value, bool):
        return "full" if value else "none"
    return value


CheckpointingPolicy = Annotated[
    Literal["auto", "full", "every_n", "selective", "none"], BeforeValidator(_policy_of_bool)
]
AttentionName = Literal[
    "auto", "flash_attention_2", "sr1_torch_varlen", "sr1_flex_document", "sr1_varlen_sdpa"
]


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# modules token_logprobs reads directly (the LM head's weight) or that a vLLM LoRA adapter cannot carry
_LORA_REFUSED = ("lm_head", "embed_tokens")


class LoraSettings(BaseModel):
    """`learner.lora`: train low-rank adapters on a frozen base instead of every weight (docs/lora.md)."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(16, ge=1, le=512, description="LoRA rank r of every adapter.")
    alpha: float = Field(
        32.0, gt=0, description="LoRA alpha: the adapter's update is scaled by alpha / rank."
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input (0: none).")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGETS),
        min_length=1,
        description="Linear layers of each decoder layer that get an adapter (default: every one, "
        "q/k/v/o_proj and gate/up/down_proj).",
    )

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, value: list[str]) -> list[str]:
        refused = [name for name in value if name in _LORA_REFUSED]
        if refused:
            raise ValueError(
                f"learner.lora.target_modules may not name {refused}: the learner computes log-probs from the LM "
                f"head's own weight and vLLM adapters carry the decoder's linear layers only; pick among "
                f"{list(LORA_TARGETS)}"
            )
        if len(set(value)) != len(value):
            raise ValueError(f"learner.lora.target_modules lists a module twice: {value}")
        return value


class LearnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # -- data flow and staleness
    groups_per_step: int = Field(
        32, ge=1, description="Prompt groups (of generators.group_size samples) per step."
    )
    max_staleness: MaxStaleness = Field(
        2,
        description="Most policy versions a trajectory may lag the learner (0 = synchronous, on-policy), or "
        "`{auto: {floor, ceiling, initial, target_kl, min_ess, patience}}` (`auto`: its defaults): a bound that "
        "follows the measured off-policy mismatch (docs/staleness.md).",
    )
    total_steps: int = Field(
        1000, ge=1, description="Steps (batches) to run; each publishes one policy version."
    )
    # -- optimisation
    lr: float = Field(1e-6, gt=0, description="Peak learning rate (AdamW).")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps to the peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1).")
    grad_clip: float = Field(1.0, gt=0, description="Clip the global gradient norm to this value.")
    ppo_mini_batch_size: int | None = Field(
        None,
        ge=1,
        description="Trajectories per optimizer update: the batch (groups_per_step x group_size) is cut into "
        "mini-batches of this size, one AdamW step each, one publish per batch (None: the whole batch, one update).",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over the batch's mini-batches per step.")
    # -- objective: the algorithm and the off-policy correction (learner/algorithms/)
    algorithm: AlgorithmConfig = Field(
        default_factory=GRPOConfig,
        description="The RL algorithm and its policy loss: {type: grpo|drgrpo|rloo|reinforce_baseline|reinforce_pp|"
        "ppo, clip_low, clip_high, kl_coef, kl_placement, kl_estimator, kl_ctrl, entropy_coef, dynamic_sampling, "
        "overlong, ...} (learner/algorithms/settings.py). reinforce_pp's own defaults put the KL in the reward "
        "(kl_coef 0.001, kl_estimator k1).",
    )
    correction: CorrectionConfig = Field(
        default_factory=TISCorrection,
        description="Off-policy correction for staleness and engine/trainer mismatch: {type: none|tis|icepop|"
        "decoupled, ...}.",
    )
    # -- execution
    num_ranks: int = Field(
        1,
        ge=1,
        description="Learner ranks (FSDP2 shards); any number for any groups_per_step: each mini-batch's "
        "trajectories are dealt to the ranks balanced by tokens (learner/minibatches.py).",
    )
    num_engines: int | None = Field(
        None,
        ge=0,
        description="Engines the learner pushes weights into (None: generators.num_engines; 0: train alone).",
    )
    collective_timeout_s: float = Field(
        600.0,
        ge=10,
        description="The learner ranks' process group timeout: a collective (FSDP's gathers, a batch sent by rank 0) "
        "that does not finish in this time ends the ranks, which their supervisor restarts. Rank 0 keeps the other "
        "ranks company every 2 s while it waits alone for as long as it must (a batch, the engines' acks, a new "
        "weight-sync group); its bounded waits inside a collective (weight_sync.timeout_s; buffer.reconnect_s + "
        "buffer.socket_timeout_s) must stay below it, which the config checks (docs/reliability.md).",
    )
    use_ray: bool = Field(False, description="Launch learner ranks as Ray actors on GPUs.")
    cpu_cores: list[int] | None = Field(
        None,
        description="Linux: pin this pool's processes (and their threads) to these CPU cores, a dedicated pool as a "
        "GPU is; None: any core. `scripts/bench/bench_async.py` gives each pool its own core this way.",
    )
    micro_batch_tokens: int = Field(
        8192, ge=16, description="Token budget of one packed micro-batch (sequence packing without padding)."
    )
    gradient_checkpointing: CheckpointingPolicy = Field(
        "auto",
        description="Activation checkpointing (recompute in the backward pass): `full` (every decoder layer), "
        "`every_n` (every learner.gradient_checkpointing_every-th layer), `selective` (cheap ops recomputed, matmul "
        "and attention outputs kept), `none`, or `auto`: on CUDA the least recompute whose estimated peak fits the "
        "GPU (learner/execution/memory.py, logged at start), on CPU none. true/false mean full/none.",
    )
    gradient_checkpointing_every: int = Field(
        2,
        ge=1,
        description="With gradient_checkpointing: every_n, checkpoint layers 0, N, 2N, ... (1: every layer).",
    )
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="torch.compile each decoder layer's forward (before FSDP2 wraps it): auto = on CUDA with an "
        "attention that keeps shapes dynamic (not the per-sequence loop), off on CPU.",
    )
    attention: AttentionName = Field(
        "auto",
        description="How packed sequences are kept apart (learner/execution/attention.py): flash_attention_2, "
        "sr1_torch_varlen (torch.nn.attention.varlen), sr1_flex_document, sr1_varlen_sdpa, or auto: on CUDA the "
        "fastest of those present, measured once per GPU and shape and logged; on CPU the per-sequence SDPA loop.",
    )
    logprob_head: Literal["auto", "fused", "chunked"] = Field(
        "auto",
        description="The LM head's log-prob/entropy step: `fused` (one compiled pass per chunk over compute-dtype "
        "logits, learner/execution/fused_head.py), `chunked` (fp32 chunk buffers, learner/execution/chunked_logprobs.py), or auto: "
        "fused on CUDA, chunked on CPU.",
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="Tokens per chunk of the LM head + log-softmax in the log-prob step: it holds about two "
        "chunk x vocab fp32 buffers instead of several tokens x vocab logits copies (the backward recomputes each "
        "chunk's logits).",
    )
    lora: LoraSettings | None = Field(
        None,
        description="LoRA: {rank, alpha, dropout, target_modules} trains adapters on a frozen base (held in "
        "model.dtype, no gradients or optimizer state) and publishes only the adapters to the engines; None: every "
        "weight is trained (docs/lora.md).",
    )
    cpu_offload: bool = Field(
        False,
        description="FSDP2 CPU offload: parameters, gradients and optimizer state live in CPU memory (the optimizer "
        "steps there) and each unit is copied to the GPU for its forward/backward. On a CPU-only run it changes "
        "nothing but the code path.",
    )
    max_nonfinite_steps: int = Field(
        3,
        ge=1,
        description="Stop the run with an error after this many steps in a row whose update was skipped because the "
        "loss or gradient norm was not finite (`loss/nonfinite_skipped`), before any checkpoint is written.",
    )
    wait_log_s: float = Field(
        30.0,
        gt=0,
        description="While the learner waits for a batch, log what it waits for (groups finished, generating, "
        "generators alive) every this many seconds.",
    )
    checkpoint_every: int = Field(
        50, ge=1, description="Save an HF checkpoint + resume state every this many steps."
    )
    keep_checkpoints: int = Field(2, ge=1, description="Keep this many most recent checkpoints.")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        for i, beta in enumerate(betas):  # AdamW's range; NaN fails the comparison too
            if not 0 <= beta < 1:
                raise ValueError(f"betas[{i}] must be a finite number in [0, 1), got {beta}")
        return betas

    @model_validator(mode="after")
    def _invariants(self) -> LearnerConfig:
        if self.warmup_steps > self.total_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be <= total_steps ({self.total_steps})"
            )
        return self
