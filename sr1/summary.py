"""Turn what a finished run left behind (metrics.jsonl, evaluations, buffer stats, heartbeats, checkpoints) into a
`RunSummary` for the report."""

from __future__ import annotations

import statistics
import time

from buffer.monitor import staleness_histogram
from sr1.report import RunSummary, read_metrics, staleness_stats


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def summarize(orch) -> RunSummary:
    cfg = orch.cfg
    rows = read_metrics(orch.run_dir / "metrics.jsonl")
    stats = orch.buffer.stats()
    histogram = staleness_histogram(stats)
    staleness_mean, staleness_max = staleness_stats(histogram)
    generators = [w.get("metrics", {}) for w in orch.buffer.workers() if w.get("role") == "generator"]
    evals = sorted(orch.evals, key=lambda e: e["step"])
    before = next((e["eval/em"] for e in evals if e["step"] == 0), None)
    after = evals[-1]["eval/em"] if evals and evals[-1]["step"] > 0 else None
    steps = max((int(r.get("step", 0)) for r in rows), default=0)
    wall = sum(r.get("perf/step_s", 0.0) for r in rows)
    waited = sum(r.get("perf/wait_s", 0.0) for r in rows)
    from learner.checkpoint import latest_checkpoint

    checkpoint = latest_checkpoint(orch.run_dir / "checkpoints")
    return RunSummary(
        run_dir=str(orch.run_dir),
        preset=cfg.name,
        seed=cfg.seed,
        max_staleness=cfg.learner.max_staleness,
        algorithm=cfg.learner.algorithm.type,
        correction=cfg.learner.correction.type,
        steps=steps,
        wall_s=time.monotonic() - orch.started,
        em_before=before,
        em_after=after,
        evals=evals,
        reward_curve=[
            (int(r["step"]), float(r["batch/reward_mean"]))
            for r in rows
            if "step" in r and "batch/reward_mean" in r
        ],  # fmt: skip
        step_s_mean=_mean([r.get("perf/step_s") for r in rows]),
        learner_tokens_per_s=_mean([r.get("perf/tokens_per_s") for r in rows]),
        generator_tokens_per_s=sum(g.get("rollout/tokens_per_s", 0.0) for g in generators) or None,
        tool_calls_per_trajectory=_mean([r.get("batch/tool_calls_per_traj") for r in rows]),
        staleness_histogram=histogram,
        staleness_mean=staleness_mean,
        staleness_max=staleness_max,
        generator_idle_fraction=_mean([g.get("rollout/idle_fraction") for g in generators]),
        learner_idle_fraction=(waited / wall) if wall > 0 else None,
        checkpoint=str(checkpoint) if checkpoint else None,
        extra={"buffer": {k: v for k, v in stats.items() if not isinstance(v, dict)}},
    )
