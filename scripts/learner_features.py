"""The learner's optional features as scripts/bench_learner.py uses them, found by feature detection: the benchmark
runs on a learner that has them and on one that does not, and says which it measured.

    overrides = config_overrides(LearnerConfig, compile="auto", checkpointing="full", every=None, attention="auto")
    counters = compiler_counters()            # {"graphs": ..., "recompiles": ..., "graph_breaks": ...}
    estimate = peak_estimate_bytes(learner, tokens=16384)      # learner/memory.py's estimate of the step's peak
    policy, why = checkpointing_for_ranks(learner_config, model_dir, ranks=6, capacity=device_bytes, dtype="bfloat16")

- Settings: `learner.compile` (auto|true|false), `learner.gradient_checkpointing` as a policy
  (auto|full|every_n|selective|none, `learner.gradient_checkpointing_every`) and `learner.attention` are set in the
  config where the config has the field. Where `gradient_checkpointing` is a bool, `full`/`none` are true/false and
  the other policies are an error naming the setting; where the config has no `attention`, the attention goes to
  `Learner(attention=...)`.
- Compiler counters: the learner's own function where it has one (`LEARNER_COUNTERS`), else dynamo's: graphs
  compiled and graph breaks from its counters, recompilations (compile ids `N/1`, `N/2`, ...) from its compile
  callbacks.
- The peak-memory estimate and the checkpointing a learner of N ranks would pick: learner/memory.py's functions
  where present (`LEARNER_ESTIMATE`, `LEARNER_CHECKPOINTING_CHOICE`), else the estimate `Learner` checks its budget
  with (`step_memory`), and for the choice: `none` where that estimate fits the device with no recompute, else `full`.
"""

from __future__ import annotations

import importlib
import re
import typing

# (module, function) of the learner's own versions; absent today, picked up when present
LEARNER_COUNTERS = ("learner.memory", "compiler_counters")
LEARNER_ESTIMATE = ("learner.memory", "estimate_peak_bytes")
LEARNER_CHECKPOINTING_CHOICE = ("learner.memory", "choose_checkpointing")

CHECKPOINTING = ("auto", "full", "every_n", "selective", "none")


def _learner_function(where: tuple[str, str]):
    module, name = where
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def _accepts_policy(config_cls) -> bool:
    """Whether `learner.gradient_checkpointing` takes a policy name (not only a bool)."""
    annotation = config_cls.model_fields["gradient_checkpointing"].annotation
    return annotation is not bool and str in _types(annotation)


def _types(annotation) -> set:
    args = typing.get_args(annotation)
    if not args:
        return {type(annotation)} if typing.get_origin(annotation) is typing.Literal else {annotation}
    if typing.get_origin(annotation) is typing.Literal:
        return {type(a) for a in args}
    return set().union(*(_types(a) for a in args))


def config_overrides(
    config_cls, *, compile: str, checkpointing: str | None, every: int | None, attention: str
) -> dict:
    """The learner config fields the options set (None/auto: leave the config's own)."""
    fields = config_cls.model_fields
    out: dict = {}
    if compile != "auto" or "compile" in fields:
        if "compile" not in fields:
            raise ValueError(f"--compile {compile}: this learner has no learner.compile setting")
        out["compile"] = {"true": True, "false": False}.get(compile, compile)
    if checkpointing is not None:
        if _accepts_policy(config_cls):
            out["gradient_checkpointing"] = checkpointing
        elif checkpointing in ("full", "none"):
            out["gradient_checkpointing"] = checkpointing == "full"
        else:
            raise ValueError(
                f"--checkpointing {checkpointing}: this learner's learner.gradient_checkpointing is a bool "
                "(full or none only)"
            )
    if every is not None:
        if "gradient_checkpointing_every" not in fields:
            raise ValueError(
                "--checkpointing-every: this learner has no learner.gradient_checkpointing_every"
            )
        out["gradient_checkpointing_every"] = every
    if "attention" in fields and attention != "auto":
        out["attention"] = attention
    return out


def learner_kwargs(config_cls, attention: str) -> dict:
    """Keyword arguments of `Learner(...)`: the attention, where the config does not carry it."""
    return {} if "attention" in config_cls.model_fields else {"attention": attention}


def checkpointing_name(value) -> str:
    """A config's gradient_checkpointing as a policy name (bools: full / none)."""
    if isinstance(value, bool):
        return "full" if value else "none"
    return str(value)


# -- compiler counters ---------------------------------------------------------------------------------------------


_COMPILES = {
    "frames": 0,
    "recompiles": 0,
}  # counted by _count_compile from the first compiler_counters() call on


def _count_compile(args) -> None:
    """A dynamo compile starts: compile ids read `frame/attempt` (`0/0`, then `0/1` for its first recompilation)."""
    if getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO") != "DYNAMO":
        return
    _COMPILES["frames"] += 1
    ids = re.findall(r"(\d+)/(\d+)", str(getattr(args, "compile_id", "")))
    if ids and int(ids[-1][1]) > 0:
        _COMPILES["recompiles"] += 1


def compiler_counters() -> dict[str, int | None] | None:
    """Graphs compiled, recompilations and graph breaks so far in this process (None where torch has no dynamo).
    Recompilations are counted from the first call on (call it once before the compiles to count)."""
    learner_counters = _learner_function(LEARNER_COUNTERS)
    if learner_counters is not None:
        counters = learner_counters()
        return {k: int(counters[k]) for k in ("graphs", "recompiles", "graph_breaks")}
    try:
        import torch._dynamo
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    handler = getattr(torch._dynamo, "callback_handler", None)
    if handler is not None and _count_compile not in handler.start_callbacks:
        handler.register_start_callback(_count_compile)
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "recompiles": _COMPILES["recompiles"] if handler is not None else None,
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def counters_since(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    return {k: None if after[k] is None else after[k] - before[k] for k in after}


# -- memory ----------------------------------------------------------------------------------------------------------


def _step_memory(
    model_config, parameters: int, cfg, dtype: str, world_size: int, reference: bool, critic: bool
):
    """main's estimate of one rank's step (learner/memory.py), as `Learner` checks its budget with it (a policy
    other than none counts as full recomputation: the estimate knows only the two)."""
    from learner.memory import StepShape, step_memory
    from learner.model import DTYPES

    shape = StepShape.of(model_config, parameters)
    if shape is None:
        return None
    return step_memory(
        shape,
        world_size=world_size,
        compute_bytes=DTYPES[dtype].itemsize,
        checkpointing=checkpointing_name(cfg.gradient_checkpointing) != "none",
        cpu_offload=cfg.cpu_offload,
        chunk_tokens=cfg.logprob_chunk_tokens,
        reference=reference,
        critic=critic,
    )


def peak_estimate_bytes(learner, tokens: int) -> float | None:
    """learner/memory.py's estimate of the step's peak at a micro-batch of `tokens` (None: the model is unknown)."""
    estimate = _learner_function(LEARNER_ESTIMATE)
    if estimate is not None:
        return float(estimate(learner, tokens))
    parameters = sum(p.numel() for p in learner.model.parameters())
    memory = _step_memory(
        learner.model.config,
        parameters,
        learner.cfg,
        learner.model_dtype,
        learner.world.world_size,
        reference=learner.reference is not None,
        critic=learner.critic is not None,
    )
    return None if memory is None else memory.peak(tokens)


def config_peak_bytes(cfg, model_dir, *, ranks: int, dtype: str) -> float | None:
    """main's estimate of the peak of one rank of a learner of `ranks` ranks under `cfg`, at `micro_batch_tokens`,
    before any model is loaded (None: the estimate does not know the model)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from learner.algorithms import build_algorithm

    model_config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        parameters = sum(p.numel() for p in AutoModelForCausalLM.from_config(model_config).parameters())
    algorithm = build_algorithm(cfg.algorithm, cfg.correction)
    memory = _step_memory(
        model_config,
        parameters,
        cfg,
        dtype,
        ranks,
        reference=algorithm.needs_reference,
        critic=algorithm.needs_values,
    )
    return None if memory is None else memory.peak(cfg.micro_batch_tokens)


def checkpointing_for_ranks(cfg, model_dir, *, ranks: int, capacity: float, dtype: str) -> tuple[str, str]:
    """The checkpointing a learner of `ranks` FSDP ranks would pick on a device of `capacity` bytes, and why."""
    choose = _learner_function(LEARNER_CHECKPOINTING_CHOICE)
    if choose is not None:
        from transformers import AutoConfig

        policy, why = choose(
            cfg, AutoConfig.from_pretrained(model_dir), ranks=ranks, capacity=capacity, dtype=dtype
        )
        return checkpointing_name(policy), why
    peak = config_peak_bytes(
        cfg.model_copy(update={"gradient_checkpointing": False}), model_dir, ranks=ranks, dtype=dtype
    )
    if peak is None:
        return "full", "the memory estimate does not know this model"
    fits = peak <= capacity
    return (
        "none" if fits else "full",
        f"estimated peak without recompute on {ranks} ranks at {cfg.micro_batch_tokens} tokens: "
        f"{peak / 2**30:.1f} GiB {'<=' if fits else '>'} {capacity / 2**30:.1f} GiB",
    )


# -- what the step computes before its updates -------------------------------------------------------------------


def step_passes(cfg, several_updates: bool) -> tuple[bool, bool, bool]:
    """(reference forward, the policy's proximal forward, a critic) of `Learner.train_step` under `cfg`: the
    trainer's own decisions, asked of it rather than restated."""
    from types import SimpleNamespace

    from learner.algorithms import build_algorithm
    from learner.trainer import Learner

    algorithm = build_algorithm(cfg.algorithm, cfg.correction)
    policy_pass = Learner._needs_policy_pass(SimpleNamespace(algorithm=algorithm), several_updates)
    return algorithm.needs_reference, policy_pass, algorithm.needs_values


def present() -> dict[str, bool]:
    """Which of the optional learner features this tree has."""
    from learner.settings import LearnerConfig

    fields = LearnerConfig.model_fields
    return {
        "learner.compile": "compile" in fields,
        "learner.gradient_checkpointing policies": _accepts_policy(LearnerConfig),
        "learner.attention": "attention" in fields,
        "compiler counters": _learner_function(LEARNER_COUNTERS) is not None,
        "memory estimate function": _learner_function(LEARNER_ESTIMATE) is not None,
        "checkpointing choice": _learner_function(LEARNER_CHECKPOINTING_CHOICE) is not None,
    }
