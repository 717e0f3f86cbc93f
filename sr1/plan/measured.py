"""Profiles measured rather than written down: from a finished run's logs, and from benchmark outputs.

    profile_from_run(Path("runs/tiny-..."), load_profile("cpu-tiny"))  # metrics.jsonl + config.yaml of `sr1 run`
    with_learner_bench(data, Path("bench.json"))     # learner tokens/s, `bench_learner.py --json`
    with_engine_bench(data, Path("engine.json"))     # engine curve, `bench_generators.py --curve ... --json`
    with_retrieval_bench(data, Path("retrieval.json"), "dense_flat/naive")  # `bench_retrieval.py --curve ... --json`
    resolve_profile(profile, from_run, learner_bench, engine_bench)  # what `sr1 plan` composes from its flags

A run measures its trajectory shapes, the learner's tokens/s, its step overhead and its publish time directly. The
engine's throughput it cannot read off a counter: a trajectory in flight spends part of its time in search round
trips and in the engine's queue, so tokens per busy second understate the engine. It is fitted instead: the engine
rate at which this simulator, run on the run's own configuration and figures, keeps the generator pool busy for the
same share of the time as the run's heartbeats say it was (`pool/busy_s` over `pool/uptime_s`). Only its scale is
fitted: its shape (tokens/s against concurrent sequences) is the profile's, best measured on the same hardware by
`bench_generators.py --curve` (`--engine-bench`).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from buffer.staleness import first_bound, largest_bound
from config import load_config
from sr1.plan.profile import (
    Profile,
    ProfileError,
    list_profiles,
    load_profile,
    validate_profile,
    with_engine_curve,
)
from sr1.plan.simulate import simulate
from sr1.plan.splits import pipeline

DEFAULT_RUN_PROFILE = (
    "cpu-tiny"  # where `--from-run` takes what a run cannot measure, unless --profile is given
)
_FIT_RATES = (1.0, 1e9)  # the engine tokens/s the fit searches between
_FIT_STEPS = 40  # bisection steps over the logarithm of the rate: far finer than the runs' own noise


def step_rows(run_dir: Path) -> list[dict]:
    """Every learner step's row of a run's `metrics.jsonl` (not its evaluations or segment markers)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise ProfileError(f"{run_dir}: no metrics.jsonl (is it a run directory of `sr1 run`?)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "step" in r and "perf/train_s" in r]


def _rows(run_dir: Path) -> list[dict]:
    steps = step_rows(run_dir)
    path = run_dir / "metrics.jsonl"
    if len(steps) < 2:
        raise ProfileError(f"{path}: needs at least 2 step rows to measure from, found {len(steps)}")
    return steps[1:]  # the first step waited for a cold system


def _mean(rows: list[dict], key: str, path: Path) -> float:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    if not values:
        raise ProfileError(f"{path}: no {key} in its step rows (a run of an older sr1?)")
    return statistics.fmean(values)


def learner_tokens_per_s(rows: list[dict], path: Path, ranks: int) -> float:
    """The learner's tokens/s per rank over `rows` (step rows of the run whose metrics are at `path`)."""
    return _mean(rows, "perf/tokens_per_s", path) / ranks


def pool_busy_fraction(rows: list[dict], path: Path) -> float:
    """The share of the generator pool's time with a trajectory in flight, between the heartbeats the first and the
    last measured step saw (cumulative `pool/busy_s` and `pool/uptime_s`, summed over workers)."""
    for key in ("pool/busy_s", "pool/uptime_s"):
        if any(key not in r for r in rows):
            raise ProfileError(f"{path}: a step row has no {key} (a run of an older sr1?)")
    first, last = rows[0], rows[-1]
    busy = float(last["pool/busy_s"]) - float(first["pool/busy_s"])
    uptime = float(last["pool/uptime_s"]) - float(first["pool/uptime_s"])
    if busy < 0 or uptime < 0:
        raise ProfileError(
            f"{path}: pool/busy_s or pool/uptime_s fell between step {first['step']} and step {last['step']} "
            "(a generator restarted): measure from a run whose pool kept running"
        )
    if uptime <= 0:
        raise ProfileError(
            f"{path}: the generator pool's heartbeat did not advance between step {first['step']} and step "
            f"{last['step']}: the run is too short to measure (run more steps)"
        )
    return busy / uptime


def fit_engine_curve(
    cfg: Any, profile: Profile, busy: float, *, bound: int, steps: int
) -> list[tuple[float, float]]:
    """The profile's engine curve, scaled so that the simulated run of `cfg` at staleness `bound` keeps its engines
    busy for the share `busy` of the time; `profile` gives every other figure. A curve of several points (measured by
    `bench_generators.py --curve`) keeps its shape; a one-point curve becomes one point at the pipeline's largest
    concurrency, linear below. A faster engine is busy for less of the time: a bisection over the scale's logarithm."""
    pipe = pipeline(cfg, engines=cfg.generators.num_engines, ranks=cfg.learner.num_ranks, max_staleness=bound)
    points = profile.generator.tokens_per_s.points
    if len(points) == 1:
        points = [(float(min(pipe.max_num_seqs, pipe.max_inflight_groups * pipe.group_size)), 1.0)]
    peak = max(y for _, y in points)
    shape = [(x, y / peak) for x, y in points]  # its highest point at 1: the scale is the peak tokens/s
    steps = max(steps, 4)

    def scaled(rate: float) -> list[tuple[float, float]]:
        return [(x, y * rate) for x, y in shape]

    def simulated_busy(rate: float) -> float:
        trial = with_engine_curve(profile, scaled(rate), "fit")
        return simulate(pipe, trial, steps=steps, warmup=1).generator_busy

    lo, hi = (math.log(r) for r in _FIT_RATES)
    if not simulated_busy(math.exp(hi)) <= busy <= simulated_busy(math.exp(lo)):
        raise ProfileError(
            f"the run's generator pool was busy {busy:.0%} of the time, which no engine rate reproduces with the "
            "profile's other figures (search latency, hand-off): give generator.tokens_per_s in a profile instead"
        )
    for _ in range(_FIT_STEPS):
        mid = (lo + hi) / 2
        if simulated_busy(math.exp(mid)) > busy:
            lo = mid  # busier than the run: the engine is faster than that
        else:
            hi = mid
    return scaled(math.exp((lo + hi) / 2))


def profile_from_run(run_dir: Path, defaults: Profile | None = None) -> Profile:
    """Measure a profile from a finished run directory: trajectory shapes, search latency, learner tokens/s and
    publish time from its `metrics.jsonl`, group size and engines from its `config.yaml`; the hand-off time
    (synchronous runs) from the learner's wait less the pool's time in flight; and the engine's throughput fitted
    to the pool's busy share.

    Figures a run cannot measure (prefill cost, the spread of lengths and latencies, memory; the hand-off of an
    asynchronous run) come from `defaults` (a profile) when given, else are named as missing."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.exists():
        raise ProfileError(f"{run_dir}: no config.yaml (is it a run directory of `sr1 run`?)")
    cfg = load_config(config_path)
    rows = _rows(run_dir)
    metrics = run_dir / "metrics.jsonl"
    for key in ("batch/groups", "batch/loss_tokens", "perf/tokens_per_s", "perf/step_s", "perf/wait_s"):
        if any(key not in r for r in rows):
            raise ProfileError(f"{metrics}: a step row has no {key} (a run of an older sr1?)")
    where = f"measured from {run_dir}/metrics.jsonl ({len(rows)} steps after the first)"
    n = cfg.generators.group_size
    trajectories = [float(r["batch/groups"]) * n for r in rows]
    loss_tokens = statistics.fmean(
        float(r["batch/loss_tokens"]) / t for r, t in zip(rows, trajectories, strict=True)
    )
    searches = _mean(rows, "batch/tool_calls_per_traj", metrics)
    response = _mean(rows, "batch/response_len_mean", metrics)
    turns = searches + 1.0
    # model tokens per step = trajectories x (prompt + response) x epochs: the prompt follows from tokens/s x time
    model_tokens = statistics.fmean(
        float(r["perf/tokens_per_s"]) * float(r["perf/train_s"]) / (t * cfg.learner.ppo_epochs)
        for r, t in zip(rows, trajectories, strict=True)
    )
    prompt = max(model_tokens - response, 1.0)
    ranks = cfg.learner.num_ranks
    busy = pool_busy_fraction(rows, metrics)
    data: dict[str, Any] = json.loads(defaults.model_dump_json()) if defaults else {}
    data.update(name=f"measured from {run_dir}", gpu_kind=data.get("gpu_kind", "cpu"))
    learner = data.setdefault("learner", {})
    learner["tokens_per_s_per_rank"] = {
        "value": learner_tokens_per_s(rows, metrics, ranks),
        "source": f"{where}: perf/tokens_per_s / {ranks} rank(s)",
    }
    learner.setdefault(
        "scaling_efficiency", {"value": 1.0, "source": f"the run had {ranks} rank(s): assumption"}
    )
    overhead = statistics.fmean(
        float(r["perf/step_s"])
        - float(r["perf/wait_s"])
        - float(r["perf/train_s"])
        - float(r.get("weight_sync/seconds", 0.0))
        - float(r.get("perf/checkpoint_s", 0.0))
        for r in rows
    )
    learner["step_overhead_s"] = {
        "value": max(overhead, 0.0),
        "source": f"{where}: perf/step_s - wait - train - publish - checkpoint",
    }
    checkpoints = [float(r["perf/checkpoint_s"]) for r in rows if "perf/checkpoint_s" in r]
    if checkpoints:
        learner["checkpoint_s"] = {
            "value": statistics.fmean(checkpoints),
            "source": f"{where}: perf/checkpoint_s",
        }
    workload = data.setdefault("workload", {})
    workload.update(
        prompt_tokens={"value": prompt, "source": f"{where}: model tokens per trajectory minus the response"},
        tokens_per_turn={
            "value": loss_tokens / turns,
            "source": f"{where}: batch/loss_tokens per trajectory / (batch/tool_calls_per_traj + 1)",
        },
        searches_per_trajectory={"value": searches, "source": f"{where}: batch/tool_calls_per_traj"},
        obs_tokens_per_search={
            "value": max(response - loss_tokens, 0.0) / searches if searches > 0 else 0.0,
            "source": f"{where}: (batch/response_len_mean - loss tokens per trajectory) / searches",
        },
    )
    latencies = [float(r["tools/latency_s"]) for r in rows if float(r.get("tools/latency_s") or 0.0) > 0]
    if latencies:
        workload["search_latency_s"] = {
            "value": statistics.fmean(latencies),
            "source": f"{where}: tools/latency_s (mean seconds per search as the generators saw it)",
        }
    last = rows[-1]
    if cfg.learner.algorithm.dynamic_sampling and last.get("buffer/produced"):
        workload["dropped_group_fraction"] = {
            "value": float(last.get("buffer/dropped_groups", 0)) / float(last["buffer/produced"]),
            "source": f"{where}: buffer/dropped_groups / buffer/produced at the last step",
        }
    data["weight_sync_s"] = {
        "value": _mean(rows, "weight_sync/seconds", metrics),
        "source": f"{where}: weight_sync/seconds",
    }
    lora = getattr(cfg.learner, "lora", None)
    if lora is not None:  # the run's learner and publish were LoRA's: the plan uses them as they are
        data["lora"] = f"rank {lora.rank} on {', '.join(lora.target_modules)}"
        pauses = [
            float(r["rollout/update_pause_s"]) for r in rows if r.get("rollout/update_pause_s") is not None
        ]
        data["engine_pause_s"] = {
            "value": statistics.fmean(pauses) if pauses else 0.0,
            "source": f"{where}: rollout/update_pause_s"
            if pauses
            else "the run trained LoRA: each update loads beside the old adapter, with no pause (not recorded)",
        }
    synchronous = largest_bound(cfg.learner.max_staleness) == 0
    if synchronous:
        # a synchronous step waits for the hand-offs and for its batch's generation, nothing else
        in_flight = busy * _mean(rows, "perf/step_s", metrics)
        data["handoff_s"] = {
            "value": max(_mean(rows, "perf/wait_s", metrics) - in_flight, 0.0),
            "source": f"{where}: perf/wait_s less the pool's time in flight per step (pool/busy_s "
            f"over pool/uptime_s = {busy:.2f}, times perf/step_s); the run was synchronous",
        }
    # the generator curve is fitted below: any placeholder lets the rest of the profile validate first
    data.setdefault("generator", {}).setdefault("tokens_per_s", {"points": [[1.0, 1.0]], "source": "fit"})
    partial = validate_profile(data, f"from run {run_dir} (give the missing figures with --profile)")
    bounds = [int(r["staleness/bound"]) for r in rows if r.get("staleness/bound") is not None]
    bound = round(statistics.fmean(bounds)) if bounds else first_bound(cfg.learner.max_staleness)
    base = partial.generator.tokens_per_s
    shape = (
        f"the shape of {base.source}"
        if len(base.points) > 1
        else "one point at the pipeline's largest concurrency, linear below"
    )
    return with_engine_curve(
        partial,
        fit_engine_curve(cfg, partial, busy, bound=bound, steps=len(rows) + 1),
        f"fitted to {run_dir}: the engine rate at which this simulator, run on the run's configuration and the "
        f"figures above, keeps the generator pool busy {busy:.2f} of the time as the run's heartbeats measured "
        f"(pool/busy_s over pool/uptime_s); {shape}",
    )


def read_bench_output(path: Path, command: str, key: str) -> dict[str, Any]:
    """A benchmark's `--json` output file, checked to hold `key` (`command` is what writes it)."""
    try:
        bench = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ProfileError(f"{path}: not a {command} output: {err}") from None
    if not isinstance(bench, dict) or key not in bench:
        raise ProfileError(f"{path}: no '{key}' (run `python scripts/{command}`)")
    return bench


def with_learner_bench(profile_data: dict[str, Any], bench_path: Path) -> dict[str, Any]:
    """`profile_data` with the learner's per-rank tokens/s taken from a `bench_learner.py --json` output file."""
    bench = read_bench_output(bench_path, "bench_learner.py --json", "packed/tokens_per_s")
    learner = dict(profile_data.get("learner", {}))
    learner["tokens_per_s_per_rank"] = {
        "value": float(bench["packed/tokens_per_s"]),
        "source": f"bench_learner.py --json in {bench_path} ({bench.get('gpu') or bench.get('device', '?')}, "
        f"{bench.get('shape', '?')}, packed, budget {bench.get('micro_batch_tokens', '?')} tokens, mean sequence "
        f"{bench.get('mean_seq_len', 0):.0f} tokens)",
    }
    return {**profile_data, "learner": learner}


def with_engine_bench(profile_data: dict[str, Any], bench_path: Path) -> dict[str, Any]:
    """`profile_data` with the generator's tokens/s curve taken from a `bench_generators.py --curve --json` output."""
    bench = read_bench_output(bench_path, "bench_generators.py --curve 8,32,128 --json", "engine_curve")
    generator = dict(profile_data.get("generator", {}))
    generator["tokens_per_s"] = {
        "points": bench["engine_curve"],
        "source": f"bench_generators.py --curve in {bench_path} (device {bench.get('device', '?')}, model "
        f"{bench.get('model', '?')}, {bench.get('date', 'undated')}): decode tokens/s at each concurrency",
    }
    return {**profile_data, "generator": generator}


def with_retrieval_bench(
    profile_data: dict[str, Any], bench_path: Path, server: str | None
) -> dict[str, Any]:
    """`profile_data` with the retrieval server's requests/s curve taken from a `bench_retrieval.py --curve --json`
    output; `server` names one of its curves (`dense_flat/batched`, `bm25/naive`, ...), or None when it has one."""
    bench = read_bench_output(bench_path, "bench_retrieval.py --curve 1,4,16,64 --json", "retrieval_curves")
    curves = bench["retrieval_curves"]
    if server is None and len(curves) == 1:
        server = next(iter(curves))
    if server not in curves:
        raise ProfileError(
            f"{bench_path}: {'no curve ' + repr(server) if server else 'several curves'}; give --retrieval-server "
            f"with one of: {', '.join(curves)}"
        )
    return {
        **profile_data,
        "retrieval": {
            "requests_per_s": {
                "points": curves[server],
                "source": f"bench_retrieval.py --curve in {bench_path} ({server}, {bench.get('date', 'undated')}, "
                f"{bench.get('machine', '?')}): requests/s against concurrent clients",
            }
        },
    }


def with_retrieval_points(profile_data: dict[str, Any], points: list[tuple[float, float]]) -> dict[str, Any]:
    """`profile_data` with the retrieval server's curve given as (clients, requests/s) points."""
    curve = {"points": [list(p) for p in points], "source": "given on the command line"}
    return {**profile_data, "retrieval": {"requests_per_s": curve}}


def resolve_profile(
    profile: str | Path | None = None,
    from_run: Path | None = None,
    learner_bench: Path | None = None,
    engine_bench: Path | None = None,
    retrieval_bench: Path | None = None,
    retrieval_server: str | None = None,
    retrieval_points: list[tuple[float, float]] | None = None,
) -> Profile:
    """The profile `sr1 plan` uses: a file, with the engine's curve from a bench output; a run's measurements over it
    when given (the fitted engine curve keeps the bench's shape); the learner's tokens/s from a bench, and the
    retrieval server's curve from a bench or given points, on top."""
    if profile is None and from_run is None:
        raise ProfileError(
            "give a profile: --profile NAME_OR_FILE, --from-run RUN_DIR (with --learner-bench FILE and "
            "--engine-bench FILE to replace the learner's figure and the engine's curve); shipped profiles: "
            f"{', '.join(list_profiles())}"
        )
    base = load_profile(profile) if profile is not None else None
    if engine_bench is not None:
        base = base or load_profile(DEFAULT_RUN_PROFILE)
        data = with_engine_bench(json.loads(base.model_dump_json()), engine_bench)
        base = validate_profile(data, f"{base.name} with {engine_bench}")
    if from_run is not None:
        # what a run cannot measure (prefill cost, spreads, memory) comes from the file, else from the shipped
        # CPU profile: each such figure keeps that profile's source, so the printed sources say so
        base = profile_from_run(from_run, base or load_profile(DEFAULT_RUN_PROFILE))
    data = json.loads(base.model_dump_json())
    if learner_bench is not None:
        data = with_learner_bench(data, learner_bench)
    if retrieval_bench is not None:
        data = with_retrieval_bench(data, retrieval_bench, retrieval_server)
    if retrieval_points is not None:
        data = with_retrieval_points(data, retrieval_points)
    return validate_profile(data, str(profile or from_run))
