"""What `sr1 plan` simulates with: the measured or given figures of one model on one kind of hardware.

A `Profile` holds every number the simulation needs, each with the source it came from (`Figure`: a value and a
`source` sentence), so a projection can always say where its inputs came from. Ways to get one:

    load_profile("qwen2.5-3b-h100")          # a profile file: a name in sr1/plan/profiles/ or a path (YAML/JSON)
    profile_from_run(Path("runs/tiny-..."))  # measured from a finished run (sr1/plan/measured.py)
    with_learner_bench(data, Path("bench.json"))  # the learner's tokens/s from `bench_learner.py --json` (idem)
    with_engine_bench(data, Path("engine.json"))  # the engine's curve from `bench_generators.py --curve` (idem)

A profile missing a number is a `ProfileError` naming the field (`generator.tokens_per_s`). `GPU_KINDS` lists the
hardware `sr1 plan --gpu-kind` knows; `check_memory` says why a split cannot hold the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sr1.plan.figures import Curve, Figure, ModelShape  # Figure and Curve: imported from here by callers

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
GIB = 1024**3


class ProfileError(ValueError):
    """A profile is missing a number, has a bad one, or cannot be read."""


class GeneratorProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens_per_s: Curve = Field(
        description="One engine (of the config's tensor-parallel size): aggregate sampled "
        "tokens/s against concurrent sequences."
    )
    prefill_cost: Figure = Field(
        description="Engine time of one prefilled token (prompt, observation) as a fraction "
        "of one decoded token's, per sequence."
    )
    min_kv_cache_gib: Figure = Field(
        description="KV-cache memory an engine needs beside its weights (GiB per GPU)."
    )
    worker_tokens_per_s: Figure | None = Field(
        None,
        description="The most sampled tokens/s one generator worker process can drive (its agent loop handles "
        "every engine step's output: `bench_generators.py --null-engine`); an engine never runs faster than its "
        "worker, and the plan says when a split's engines would. None: not modelled.",
    )
    lora_decode_speed: Figure | None = Field(
        None,
        description="An engine's tokens/s serving a LoRA adapter as a fraction of its tokens/s on the base model "
        "(vLLM's LoRA kernels beside every adapted layer); applied to the curve when the config trains LoRA.",
    )
    adapter_gib: Figure | None = Field(
        None,
        description="GiB per GPU an engine reserves for its LoRA adapter slots (vLLM's max_loras); None: 0.",
    )


class LearnerProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens_per_s_per_rank: Figure = Field(
        description="Model tokens (prompt + response, every PPO epoch) per second "
        "of the optimisation step, per learner rank."
    )
    scaling_efficiency: Figure = Field(
        description="Per-rank throughput with several ranks as a fraction of one "
        "rank's (FSDP2 all-gathers and reduce-scatters)."
    )
    step_overhead_s: Figure = Field(
        description="Seconds per step beside the token work (batch forwarding, optimizer, bookkeeping)."
    )
    bytes_per_param: Figure = Field(
        description="Sharded training state per parameter (fp32 master, gradient, two AdamW moments: 16)."
    )
    activation_gib: Figure = Field(description="Peak memory per rank beside the sharded state (GiB).")
    reference_bytes_per_param: Figure | None = Field(
        None,
        description="Memory per parameter of the frozen KL reference, sharded (None: 4, its fp32 shards; a LoRA "
        "learner's reference is its own model with the adapters disabled: 0).",
    )
    critic_bytes_per_param: Figure | None = Field(
        None, description="A PPO critic's training state per parameter, sharded (None: `bytes_per_param`)."
    )
    recomputed_forwards: Figure | None = Field(
        None,
        description="Forward passes the step of `tokens_per_s_per_rank` recomputed per token, as a share of one "
        "forward (1: full gradient checkpointing, 0: none); the LoRA derivation needs it (None: 0).",
    )
    checkpoint_s: Figure = Field(
        description="Seconds to save one checkpoint (every `learner.checkpoint_every` steps)."
    )


class WorkloadProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt_tokens: Figure = Field(description="Mean prompt tokens of a trajectory.")
    tokens_per_turn: Figure = Field(description="Mean tokens the model samples in one turn.")
    tokens_per_turn_cv: Figure = Field(
        description="Coefficient of variation of tokens per turn (lognormal; 0: every turn the same length)."
    )
    searches_per_trajectory: Figure = Field(
        description="Mean searches per trajectory (binomial over max_turns)."
    )
    obs_tokens_per_search: Figure = Field(description="Mean observation tokens one search appends.")
    search_latency_s: Figure = Field(description="Mean seconds of one search round trip (retrieval server).")
    search_latency_cv: Figure = Field(
        description="Coefficient of variation of the search latency (lognormal)."
    )
    dropped_group_fraction: Figure = Field(
        description="Share of groups dynamic sampling drops (all rewards "
        "equal); used only when the config enables it."
    )


class RetrievalProfile(BaseModel):
    """The retrieval server as a shared resource: searches queue at it."""

    model_config = ConfigDict(extra="forbid")

    requests_per_s: Curve = Field(
        description="Requests/s the server answers against concurrent clients (one query each), "
        "`bench_retrieval.py --curve`. With it a search's round trip is `workload.search_latency_s` plus the "
        "delay the server's load adds: its time in the server under processor sharing of this curve, less its "
        "time there alone."
    )


class SearchR1Profile(BaseModel):
    """Search-R1 as it runs (veRL's synchronous multi-turn loop, colocated on every GPU): the figures its loop
    needs beside the shared ones (sr1/plan/search_r1.py)."""

    model_config = ConfigDict(extra="forbid")

    decode_step_floor_s: Figure = Field(
        description="Least seconds per decode step of Search-R1's vLLM engine (enforce_eager: no CUDA graphs, "
        "so a step costs at least its kernel launches); 0: the engine curve alone."
    )
    run_on_tokens: Figure = Field(
        description="Mean tokens a searching turn samples past its `</search>` (Search-R1's engine has no stop "
        "strings: a turn runs to EOS or the per-turn cap); cut off before the next turn."
    )
    generate_call_s: Figure = Field(
        description="Seconds per `generate_sequences` call (one per turn) beside the generation: the actor's "
        "parameters loaded from CPU and copied into vLLM, the KV cache built and freed."
    )
    trainer_mfu: Figure = Field(
        description="Model FLOPs utilisation of veRL's FSDP passes (6 x params per token for the update, 2 x "
        "params for a forward: the log-prob recomputes and the reference) against the GPU's dense bf16 peak."
    )
    step_overhead_s: Figure = Field(
        description="Seconds per step beside the passes above (rewards, advantages, balancing, optimizer "
        "state to and from CPU, logging)."
    )
    retrieval_queries_per_s: Figure = Field(
        description="Queries/s of Search-R1's retrieval server answering the one request that carries a whole "
        "turn's queries."
    )


class Profile(BaseModel):
    """Every figure `sr1 plan` simulates with, each with its source."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="What this profile describes (model, hardware, where measured).")
    gpu_kind: str = Field(description="The hardware the figures are for (a key of GPU_KINDS).")
    params_billion: Figure = Field(description="Model parameters, in billions.")
    generator: GeneratorProfile = Field(description="One generator engine.")
    learner: LearnerProfile = Field(description="One learner rank.")
    workload: WorkloadProfile = Field(description="The trajectories: lengths, searches, latencies.")
    weight_sync_s: Figure = Field(
        description="Seconds one publish takes the learner (and pauses the engines)."
    )
    engine_pause_s: Figure | None = Field(
        None,
        description="Seconds one update stops each engine's decoding, from the publish's start (None: the whole "
        "publish, as full weights do; a LoRA adapter loads beside the old one: 0).",
    )
    shared_gpu_speed: Figure | None = Field(
        None,
        description="On a GPU shared by an engine and a learner rank, each one's speed while the other is busy, "
        "as a share of its speed alone (None: the shared layout is not planned).",
    )
    lora: str | None = Field(
        None,
        description="The LoRA learner these figures are for (measured from a LoRA run, or derived); None: full "
        "weights, from which a plan with learner.lora derives them (sr1/plan/lora.py).",
    )
    shape: ModelShape | None = Field(
        None,
        description="The decoder's shape (LoRA's adapter and memory are derived from it; None: no LoRA).",
    )
    handoff_s: Figure = Field(
        description="Seconds from a prompt's release until its group runs in an engine, "
        "plus a finished group's way to the learner (claim, put, take), lumped together."
    )
    retrieval: RetrievalProfile | None = Field(
        None, description="The retrieval server's throughput curve; None: searches never queue."
    )
    search_r1: SearchR1Profile | None = Field(
        None, description="Figures of the 'Search-R1 as it runs' baseline; None: the plan leaves it out."
    )
    notes: list[str] = Field(
        default_factory=list, description="Assumptions and caveats, printed with the plan."
    )

    @model_validator(mode="after")
    def _in_range(self) -> Profile:
        for key, figure in _walk(self, ""):
            if isinstance(figure, Curve):
                continue  # a curve checks itself
            value = figure.value
            if key in POSITIVE and value <= 0:
                raise ValueError(f"{key} must be > 0, got {value:g}")
            if value < 0:
                raise ValueError(f"{key} must be >= 0, got {value:g}")
        if self.workload.dropped_group_fraction.value >= 1:
            raise ValueError(
                f"workload.dropped_group_fraction must be < 1 (every group dropped never fills a batch), got "
                f"{self.workload.dropped_group_fraction.value:g}"
            )
        for key in ("generator.lora_decode_speed", "shared_gpu_speed"):
            figure = dict(_walk(self, "")).get(key)
            if figure is not None and figure.value > 1:
                raise ValueError(f"{key} must be <= 1 (a share of the speed alone), got {figure.value:g}")
        if self.search_r1 is not None and self.search_r1.trainer_mfu.value > 1:
            raise ValueError(f"search_r1.trainer_mfu must be <= 1, got {self.search_r1.trainer_mfu.value:g}")
        return self


# figures a simulation divides by, or that make no sense at zero
POSITIVE = {
    "params_billion",
    "learner.tokens_per_s_per_rank",
    "learner.scaling_efficiency",
    "workload.tokens_per_turn",
    "learner.bytes_per_param",
    "generator.worker_tokens_per_s",
    "search_r1.trainer_mfu",
    "search_r1.retrieval_queries_per_s",
    "generator.lora_decode_speed",
    "shared_gpu_speed",
}


class GpuKind(BaseModel):
    memory_gib: float | None = Field(description="Memory per device; None: not checked (CPU cores).")
    peak_tflops: float | None = Field(
        description="Dense bf16 peak TFLOP/s (the vendor's datasheet); None: unknown (CPU cores)."
    )
    description: str = Field(description="What it is.")


GPU_KINDS: dict[str, GpuKind] = {
    "h100": GpuKind(memory_gib=80.0, peak_tflops=989.0, description="NVIDIA H100 80GB (SXM)"),
    "h200": GpuKind(memory_gib=141.0, peak_tflops=989.0, description="NVIDIA H200 141GB"),
    "a100-80gb": GpuKind(memory_gib=80.0, peak_tflops=312.0, description="NVIDIA A100 80GB"),
    "a100-40gb": GpuKind(memory_gib=40.0, peak_tflops=312.0, description="NVIDIA A100 40GB"),
    "l40s": GpuKind(memory_gib=48.0, peak_tflops=362.0, description="NVIDIA L40S 48GB"),
    "cpu": GpuKind(
        memory_gib=None,
        peak_tflops=None,
        description="CPU cores pinned one per pool member (memory not checked)",
    ),
}


def gpu_kind(name: str) -> GpuKind:
    """The known GPU kind `name`, or a ProfileError listing the known ones."""
    if name not in GPU_KINDS:
        raise ProfileError(f"unknown GPU kind {name!r}; known: {', '.join(GPU_KINDS)}")
    return GPU_KINDS[name]


def validate_profile(data: dict[str, Any], origin: str) -> Profile:
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"])
            if e["type"] == "missing":
                problems.append(f"missing number {where}")
            else:
                message = e["msg"].removeprefix("Value error, ")
                problems.append(f"{where}: {message}" if where else message)
        raise ProfileError(f"profile {origin}: " + "; ".join(problems)) from None


def list_profiles() -> list[str]:
    """Names of the profiles shipped in sr1/plan/profiles/."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A profile from a file (YAML or JSON), or by name from sr1/plan/profiles/."""
    path = Path(name_or_path)
    if not path.exists():
        path = PROFILES_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise ProfileError(
            f"no profile file {name_or_path!r}; shipped profiles: {', '.join(list_profiles())}"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ProfileError(f"profile {path}: not YAML/JSON: {err}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"profile {path}: expected a mapping at the top level")
    return validate_profile(data, str(path))


def with_figures(
    profile: Profile, figures: dict[str, float], source: str = "given on the command line"
) -> Profile:
    """`profile` with some figures replaced, by dotted name (`learner.tokens_per_s_per_rank`), each with `source`."""
    data = json.loads(profile.model_dump_json())
    for key, value in figures.items():
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not isinstance(node.get(last), dict) or "value" not in node[last]:
            known = ", ".join(k for k, f in _walk(profile, "") if isinstance(f, Figure))
            raise ProfileError(f"no figure {key!r} in the profile; figures: {known}")
        node[last] = {"value": float(value), "source": source}
    return validate_profile(data, f"{profile.name} with {', '.join(figures)}")


def with_engine_curve(
    profile: Profile, points: list[tuple[float, float]], source: str | None = None
) -> Profile:
    """`profile` with the generator's tokens/s curve replaced by `points` ((concurrent sequences, tokens/s), ...);
    the curve keeps its source unless `source` is given."""
    data = json.loads(profile.model_dump_json())
    curve = data["generator"]["tokens_per_s"]
    curve["points"] = [list(point) for point in points]
    if source is not None:
        curve["source"] = source
    return validate_profile(data, f"{profile.name} with generator.tokens_per_s")


def _walk(model: BaseModel, prefix: str) -> list[tuple[str, Figure | Curve]]:
    """(dotted field, figure or curve) for every figure and curve under `model` (sections left out are skipped)."""
    out: list[tuple[str, Figure | Curve]] = []
    for name in type(model).model_fields:
        value, key = getattr(model, name), prefix + name
        if isinstance(value, Figure | Curve):
            out.append((key, value))
        elif isinstance(value, BaseModel) and not isinstance(value, ModelShape):
            out += _walk(value, key + ".")
    return out


def profile_sources(profile: Profile) -> list[tuple[str, str, str]]:
    """(dotted field, value as text, source) for every figure and curve of the profile."""
    return [
        (key, f"{f.value:g}", f.source)
        if isinstance(f, Figure)
        else (key, ", ".join(f"{x:g}:{y:,.0f}" for x, y in f.points), f.source)
        for key, f in _walk(profile, "")
    ]


def learner_memory_gib(profile: Profile, ranks: int, *, reference: bool, critic: bool) -> float:
    """Peak GiB per learner rank: the sharded training state (and the frozen reference's fp32 shards, a critic's
    state) plus activations, as the learner's own check counts them (learner/execution/memory.py)."""
    params = profile.params_billion.value * 1e9
    learner = profile.learner
    state = params * learner.bytes_per_param.value
    if critic:  # as the policy, or every weight trained beside a LoRA policy
        state += params * (learner.critic_bytes_per_param or learner.bytes_per_param).value
    if reference:  # loaded as the policy is (fp32 shards), without gradients or moments; LoRA's costs nothing
        per_param = learner.reference_bytes_per_param
        state += params * (4.0 if per_param is None else per_param.value)
    return state / ranks / GIB + profile.learner.activation_gib.value


def engine_memory_gib(profile: Profile, tensor_parallel: int) -> float:
    """GiB per GPU an engine needs: its bf16 weights' shard and the least KV cache it should run with."""
    adapters = profile.generator.adapter_gib.value if profile.generator.adapter_gib else 0.0
    return (
        profile.params_billion.value * 1e9 * 2 / tensor_parallel / GIB
        + profile.generator.min_kv_cache_gib.value
        + adapters
    )


def check_memory(
    profile: Profile,
    kind: GpuKind,
    *,
    ranks: int,
    tensor_parallel: int,
    gpu_memory_utilization: float,
    reference: bool,
    critic: bool,
) -> str | None:
    """Why this split cannot hold the model (learner or engine memory), or None when it fits."""
    if kind.memory_gib is None:
        return None
    learner = learner_memory_gib(profile, ranks, reference=reference, critic=critic)
    if learner > kind.memory_gib:
        return f"learner needs {learner:.1f} GiB per rank on {ranks} rank(s), more than {kind.memory_gib:.0f} GiB"
    engine = engine_memory_gib(profile, tensor_parallel)
    budget = kind.memory_gib * gpu_memory_utilization
    if engine > budget:
        return (
            f"engine needs {engine:.1f} GiB per GPU at TP {tensor_parallel}, more than {budget:.1f} GiB "
            f"({gpu_memory_utilization:.2f} of {kind.memory_gib:.0f} GiB)"
        )
    return None
