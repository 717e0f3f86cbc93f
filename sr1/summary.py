"""Turn what a finished run left behind (metrics.jsonl, evaluations, buffer stats, heartbeats, checkpoints) into a
`RunSummary` for the report."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from buffer.monitor import staleness_histogram
from buffer.staleness import describe
from learner.checkpoints.checkpointer import latest_checkpoint
from sr1.report import (
    RunSummary,
    checkpoint_failures,
    dead_letter_counts,
    engine_update_figures,
    offpolicy_curve,
    pool_peak,
    read_metrics,
    staleness_stats,
    tool_totals,
)


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


@dataclass
class Segment:
    """One learner process's part of the run: from its start marker to its last step row."""

    start_version: int
    weights_version: int  # the version whose weights it started from (the checkpoint's, 0 for none)
    started: float
    rows: list[dict] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return (self.rows[-1]["time"] - self.started) if self.rows else 0.0


def surviving_history(lines: list[dict]) -> tuple[list[dict], list[Segment]]:
    """The step rows of metrics.jsonl that the run's weights still contain, and the learner segments.

    A learner that resumed from the checkpoint of version W (or from the initial weights) threw away the steps after
    W that an earlier segment had logged: their rows are dropped, so curves show the history that survives."""
    segments: list[Segment] = []
    for line in lines:
        if "segment" in line:
            info = line["segment"]
            segments.append(
                Segment(int(info["start"]), int(info.get("weights", info["start"])), float(info["time"]))
            )
        elif "step" in line:
            if not segments:  # a file written before segments were marked: one segment
                segments.append(
                    Segment(0, 0, float(line.get("time", 0.0)) - float(line.get("perf/step_s", 0.0)))
                )
            segments[-1].rows.append(line)
    kept: list[dict] = []
    for segment in segments:
        kept = [r for r in kept if r["step"] <= segment.weights_version] + segment.rows
    return kept, segments


def summarize(orch) -> RunSummary:
    cfg = orch.cfg
    lines = read_metrics(orch.run_dir / "metrics.jsonl")
    rows, segments = surviving_history(lines)
    stats = orch.buffer.stats()
    histogram = staleness_histogram(stats)
    staleness_mean, staleness_max = staleness_stats(histogram)
    generators = [w.get("metrics", {}) for w in orch.buffer.workers() if w.get("role") == "generator"]
    evals = sorted(orch.evals, key=lambda e: e["step"])
    before = next((e["eval/em"] for e in evals if e["step"] == 0), None)
    after = evals[-1]["eval/em"] if evals and evals[-1]["step"] > 0 else None
    steps = max((int(r.get("step", 0)) for r in rows), default=0)
    # each segment's first step waited for the first groups of a cold system: shown apart from the step times
    firsts = [seg.rows[0] for seg in segments if seg.rows]
    later = [r for seg in segments for r in seg.rows[1:]]
    wall = sum(r.get("perf/step_s", 0.0) for r in later)
    waited = sum(r.get("perf/wait_s", 0.0) for r in later)

    tool_calls, tool_errors, tool_latency_s = tool_totals(rows)

    checkpoint = latest_checkpoint(orch.run_dir / "checkpoints")
    return RunSummary(
        run_dir=str(orch.run_dir),
        preset=cfg.name,
        seed=cfg.seed,
        max_staleness=describe(cfg.learner.max_staleness),
        algorithm=cfg.learner.algorithm.type,
        correction=cfg.learner.correction.type,
        steps=steps,
        wall_s=sum(seg.seconds for seg in segments),
        segments=len(segments),
        first_wait_s=sum(r.get("perf/wait_s", 0.0) for r in firsts),
        em_before=before,
        em_after=after,
        evals=evals,
        reward_curve=[
            (int(r["step"]), float(r["batch/reward_mean"]))
            for r in rows
            if "step" in r and "batch/reward_mean" in r
        ],
        step_s_mean=_mean([r.get("perf/step_s") for r in later]),
        learner_tokens_per_s=_mean([r.get("perf/tokens_per_s") for r in rows]),
        generator_tokens_per_s=sum(g.get("rollout/tokens_per_s", 0.0) for g in generators) or None,
        tool_calls_per_trajectory=_mean([r.get("batch/tool_calls_per_traj") for r in rows]),
        staleness_histogram=histogram,
        offpolicy=offpolicy_curve(rows),
        dead_letters=dead_letter_counts(stats),
        tool_calls=tool_calls,
        tool_errors=tool_errors,
        tool_latency_s=tool_latency_s,
        generator_tool_errors=pool_peak(rows, "pool/tool_errors_total"),
        generator_tool_pauses=pool_peak(rows, "pool/tool_pauses"),
        staleness_mean=staleness_mean,
        staleness_max=staleness_max,
        generator_idle_fraction=_mean([g.get("rollout/idle_fraction") for g in generators]),
        learner_idle_fraction=(waited / wall) if wall > 0 else None,
        checkpoint=str(checkpoint) if checkpoint else None,
        checkpoint_failures=checkpoint_failures(lines),
        engine_updates=engine_update_figures(generators),
        extra={"buffer": {k: v for k, v in stats.items() if not isinstance(v, dict)}},
    )
