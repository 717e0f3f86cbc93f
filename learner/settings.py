"""The `learner` config section: the algorithm with its staleness correction, FSDP2 training, checkpoints."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from learner.algorithms.settings import (
    AlgorithmConfig,
    CorrectionConfig,
    GRPOConfig,
    TISCorrection,
    variant_shorthand,
)


class LearnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # -- data flow and staleness
    groups_per_step: int = Field(
        32, ge=1, description="Prompt groups (of generators.group_size samples) per step."
    )
    max_staleness: int = Field(
        2,
        ge=0,
        description="Most policy versions a trajectory may lag the learner (0 = synchronous, on-policy).",
    )
    total_steps: int = Field(
        1000, ge=1, description="Steps (batches) to run; each publishes one policy version."
    )
    # -- optimisation
    lr: float = Field(1e-6, gt=0, description="Peak learning rate (AdamW).")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps to the peak learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
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
    num_ranks: int = Field(1, ge=1, description="Learner ranks (FSDP2 shards).")
    num_engines: int | None = Field(
        None,
        ge=0,
        description="Engines the learner pushes weights into (None: generators.num_engines; 0: train alone).",
    )
    use_ray: bool = Field(False, description="Launch learner ranks as Ray actors on GPUs.")
    cpu_cores: list[int] | None = Field(
        None,
        description="Linux: pin this pool's processes (and their threads) to these CPU cores, a dedicated pool as a "
        "GPU is; None: any core. `scripts/bench_async.py` gives each pool its own core this way.",
    )
    micro_batch_tokens: int = Field(
        8192, ge=16, description="Token budget of one packed micro-batch (sequence packing without padding)."
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass.")
    logprob_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="Tokens per chunk of the LM head + log-softmax in the log-prob step: it holds about two "
        "chunk x vocab fp32 buffers instead of several tokens x vocab logits copies (the backward recomputes each "
        "chunk's logits).",
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

    _shorthand = field_validator("algorithm", "correction", mode="before")(variant_shorthand)

    @model_validator(mode="after")
    def _invariants(self) -> LearnerConfig:
        if self.groups_per_step % self.num_ranks:
            raise ValueError(
                f"groups_per_step ({self.groups_per_step}) must be divisible by num_ranks ({self.num_ranks})"
            )
        if self.warmup_steps > self.total_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) must be <= total_steps ({self.total_steps})"
            )
        return self
