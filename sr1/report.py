"""The end-of-run report of `sr1 run`: `report.json`, `report.md` and PNG plots in the run directory.

Inputs are plain data gathered by the orchestrator: the learner's metrics (one dict per step, from
`metrics.jsonl`), the evaluations (before, during, after), the staleness histogram of consumed tokens, and
throughput/idle figures of the pools.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunSummary:
    run_dir: str
    preset: str
    seed: int
    max_staleness: int | str  # a bound, or "auto"
    correction: str
    algorithm: str
    steps: int
    wall_s: float  # the learner's wall time over every segment (a resumed run has several)
    em_before: float | None
    em_after: float | None
    evals: list[dict[str, Any]] = field(default_factory=list)  # {"step", "eval/version", "eval/em", ...}
    reward_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, mean reward of the batch)
    step_s_mean: float | None = None
    learner_tokens_per_s: float | None = None
    generator_tokens_per_s: float | None = None
    tool_calls_per_trajectory: float | None = None
    staleness_histogram: dict[int, int] = field(default_factory=dict)  # staleness -> tokens
    # per logged step, the off-policy diagnostics: {"step", "offpolicy_kl", "mismatch_kl", "is_ess", "clipped_frac", "masked_frac",
    # "bound", "staleness_mean"} (`offpolicy_curve`)
    offpolicy: list[dict[str, float]] = field(default_factory=list)
    staleness_mean: float | None = None
    staleness_max: int | None = None
    generator_idle_fraction: float | None = None
    learner_idle_fraction: float | None = None
    checkpoint: str | None = None
    checkpoint_failures: int = 0  # checkpoints that could not be written (a full disk), over every segment
    segments: int = 1  # learner processes the run took (1 + resumes and restarts)
    # work that left the run for good, by reason (buffer counters), and the trained batches' tool calls
    dead_letters: dict[str, int] = field(default_factory=dict)
    tool_calls: int = 0
    tool_errors: int = 0
    tool_latency_s: float | None = None  # mean seconds per tool call over the trained batches
    generator_tool_errors: int = (
        0  # every failed tool call of the generators (trained or not), from their heartbeats
    )
    generator_tool_pauses: int = 0  # times a generator paused sampling for tool errors
    first_wait_s: float = (
        0.0  # the first step of each segment waiting for the first groups (not in step times)
    )
    # how weight updates stopped the engines' decoding and whether they sample from what they loaded
    # (`engine_update_figures`)
    engine_updates: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def em_gain(self) -> float | None:
        if self.em_before is None or self.em_after is None:
            return None
        return self.em_after - self.em_before


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL metrics file; a torn last line (the writer was killed) is skipped."""
    return read_metric_lines(path.read_text().splitlines()) if path.exists() else []


def read_metric_lines(lines: list[str]) -> list[dict[str, Any]]:
    """Parse JSONL lines, skipping any that are not JSON (a torn write)."""
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


DEAD_LETTER_REASONS = {  # buffer stats key -> what the report calls it
    "buffer/poison_prompts": "poison prompts (every lease expired)",
    "buffer/failed_prompts": "failed prompts (every try raised)",
    "buffer/malformed": "malformed payloads",
    "buffer/oversized": "oversized payloads",
    "buffer/untrainable": "untrainable groups (over the learner's token budget)",
}


def dead_letter_counts(stats: dict[str, Any]) -> dict[str, int]:
    """Dead letters by reason from `ReplayBuffer.stats()`, plus how many in-flight groups were replaced."""
    counts = {label: int(stats.get(key, 0)) for key, label in DEAD_LETTER_REASONS.items()}
    return counts | {"replaced by a new release": int(stats.get("buffer/abandoned_groups", 0))}


def tool_totals(rows: list[dict[str, Any]]) -> tuple[int, int, float | None]:
    """Tool calls, failed calls and mean latency (s per call) over the steps' `tools/*` metrics."""
    calls = sum(int(r.get("tools/calls", 0)) for r in rows)
    errors = sum(int(r.get("tools/errors", 0)) for r in rows)
    seconds = sum(r.get("tools/latency_s", 0.0) * r.get("tools/calls", 0) for r in rows)
    return calls, errors, (seconds / calls if calls else None)


def pool_peak(rows: list[dict[str, Any]], key: str) -> int:
    """The largest value a cumulative pool figure (`pool/...`, summed over the workers alive) reached."""
    return int(max((r.get(key, 0) for r in rows), default=0))


def engine_update_figures(generators: list[dict[str, Any]]) -> dict[str, Any]:
    """From the generators' heartbeats: updates loaded, the pause each update cost an engine's decoding
    (`rollout/update_pause_s`: median and p95 of the worst engine, and the largest), the largest probe difference
    of the last update and the adapter mismatches found (docs/lora.md). Empty before any update."""
    loaded = [g for g in generators if g.get("rollout/updates_loaded")]
    if not loaded:
        return {}
    return {
        "updates_loaded": int(sum(g["rollout/updates_loaded"] for g in loaded)),
        "pause_s_p50": max(g.get("rollout/update_pause_s_p50", 0.0) for g in loaded),
        "pause_s_p95": max(g.get("rollout/update_pause_s_p95", 0.0) for g in loaded),
        "pause_s_max": max(g.get("rollout/update_pause_s_max", 0.0) for g in loaded),
        "probe_diff": max(g.get("rollout/adapter_probe_diff", 0.0) for g in loaded),
        "adapter_mismatches": int(sum(g.get("rollout/adapter_mismatches", 0) for g in loaded)),
    }


def engine_update_rows(figures: dict[str, Any]) -> str:
    """The report's rows of `engine_update_figures`."""
    if not figures:
        return "| engine weight updates | none loaded |"
    mismatches = figures["adapter_mismatches"]
    return "\n".join(
        [
            f"| engine weight updates loaded (all engines) | {figures['updates_loaded']} |",
            f"| decoding paused per update: median / p95 / max (worst engine) | {figures['pause_s_p50']:.3f} / "
            f"{figures['pause_s_p95']:.3f} / {figures['pause_s_max']:.3f} s |",
            f"| probe log-prob difference after the last update (worst engine) | {figures['probe_diff']:.4f} |",
            f"| updates after which an engine sampled from another policy (AdapterMismatch) | {mismatches}"
            + (" (see logs/gen-*.log)" if mismatches else "")
            + " |",
        ]
    )


def checkpoint_failures(lines: list[dict[str, Any]]) -> int:
    """Checkpoints that could not be written, over every learner segment of metrics.jsonl (segment markers
    included): each failure raises `checkpoint/failed_in_a_row`, logged on the step it happened."""
    failures, in_a_row = 0, 0
    for line in lines:
        if "segment" in line:
            in_a_row = 0  # a new learner process starts with none failed
        elif "checkpoint/failed_in_a_row" in line:
            now = int(line["checkpoint/failed_in_a_row"])
            failures += max(0, now - in_a_row)
            in_a_row = now
    return failures


# metrics.jsonl key -> the name in RunSummary.offpolicy
OFFPOLICY_KEYS = {
    "loss/offpolicy_kl": "offpolicy_kl",
    "loss/mismatch_kl": "mismatch_kl",
    "loss/is_ess": "is_ess",
    "loss/clipped_frac": "clipped_frac",
    "loss/masked_frac": "masked_frac",
    "staleness/bound": "bound",
    "staleness/mean": "staleness_mean",
}


def offpolicy_curve(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The off-policy diagnostics of every step row that has them."""
    out = []
    for r in rows:
        if "step" in r and "loss/mismatch_kl" in r:
            out.append(
                {"step": int(r["step"])} | {name: r[k] for k, name in OFFPOLICY_KEYS.items() if k in r}
            )
    return out


def offpolicy_figures(curve: list[dict[str, float]]) -> dict[str, str]:
    """The report's rows of off-policy diagnostics: mean and worst step of each (docs/metrics.md has thresholds)."""

    def values(name: str) -> list[float]:
        return [float(c[name]) for c in curve if c.get(name) is not None]

    def mean_and(name: str, worst, digits: int) -> str:
        got = values(name)
        if not got:
            return "n/a"
        return f"{sum(got) / len(got):.{digits}f} / {worst(got):.{digits}f}"

    bounds = values("bound")
    return {
        "off-policy KL per token (behaviour vs step start), mean / largest step": mean_and(
            "offpolicy_kl", max, 4
        ),
        "mismatch KL per token (behaviour vs every update), mean / largest step": mean_and(
            "mismatch_kl", max, 4
        ),
        "importance-weight ESS, mean / smallest step": mean_and("is_ess", min, 3),
        "clipped token share, mean / largest step": mean_and("clipped_frac", max, 3),
        "masked token share, mean / largest step": mean_and("masked_frac", max, 3),
        "staleness bound in force, lowest / highest": f"{min(bounds):.0f} / {max(bounds):.0f}"
        if bounds
        else "n/a",
    }


def staleness_stats(histogram: dict[int, int]) -> tuple[float | None, int | None]:
    total = sum(histogram.values())
    if not total:
        return None, None
    mean = sum(int(k) * v for k, v in histogram.items()) / total
    return mean, max(int(k) for k, v in histogram.items() if v)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def write_plots(summary: RunSummary, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    if summary.reward_curve:
        steps, rewards = zip(*summary.reward_curve, strict=True)
        ax.plot(steps, rewards, label="train reward (batch mean)", color="tab:blue", alpha=0.8)
    if summary.evals:
        ax.plot(
            [e["step"] for e in summary.evals],
            [e["eval/em"] for e in summary.evals],
            "o-",
            label="test EM (greedy)",
            color="tab:red",
        )
    ax.set_xlabel("learner step")
    ax.set_ylabel("reward / exact match")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(
        f"{summary.preset}: {summary.algorithm}, max_staleness={summary.max_staleness}, "
        f"correction={summary.correction}"
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    paths.append(out_dir / "reward_em.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if summary.staleness_histogram:
        keys = sorted(int(k) for k in summary.staleness_histogram)
        values = [summary.staleness_histogram[k] for k in keys]
        ax.bar(keys, values, color="tab:purple")
        ax.set_xticks(keys)
    bounds = [c["bound"] for c in summary.offpolicy if c.get("bound") is not None]
    bound = max(bounds) if bounds else summary.max_staleness
    if isinstance(bound, (int, float)):
        ax.axvline(bound + 0.5, color="gray", linestyle="--", label=f"largest bound ({bound:.0f})")
    ax.set_xlabel("staleness (learner version - token version)")
    ax.set_ylabel("loss tokens")
    ax.set_title("staleness of trained tokens")
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "staleness.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    # the off-policy diagnostics per step: mismatch KL, ESS, and the bound against the staleness trained
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    curve = summary.offpolicy
    steps = [c["step"] for c in curve]
    for ax, name, label in (
        (axes[0], "offpolicy_kl", "off-policy KL (k3, per token)"),
        (axes[1], "is_ess", "importance-weight ESS"),
    ):
        ax.plot(
            steps, [c.get(name) for c in curve], color="tab:red" if name == "offpolicy_kl" else "tab:green"
        )
        ax.set_xlabel("learner step")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    axes[1].set_ylim(0, 1.02)
    axes[2].step(steps, [c.get("bound") for c in curve], where="post", color="gray", label="bound in force")
    axes[2].plot(steps, [c.get("staleness_mean") for c in curve], color="tab:purple", label="mean staleness")
    axes[2].set_xlabel("learner step")
    axes[2].set_title("staleness (versions)", fontsize=9)
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "offpolicy.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def write_report(summary: RunSummary, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = asdict(summary)
    data["em_gain"] = summary.em_gain
    data["staleness_histogram"] = {str(k): v for k, v in summary.staleness_histogram.items()}
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps(data, indent=2))
    plots = write_plots(summary, out_dir)

    evals = "\n".join(
        f"| {e['step']} | {e.get('eval/version', '')} | {e['eval/em']:.3f} | {_fmt(e.get('eval/tool_calls_per_traj'), 2)} |"
        for e in summary.evals
    )
    lost = "\n".join(f"| {reason} | {count} |" for reason, count in summary.dead_letters.items())
    hist = ", ".join(f"{k}: {v}" for k, v in sorted(summary.staleness_histogram.items()))
    offpolicy = "\n".join(
        f"| {label} | {value} |" for label, value in offpolicy_figures(summary.offpolicy).items()
    )
    md = f"""# sr1 run report

Run directory: `{summary.run_dir}` · preset `{summary.preset}` · seed {summary.seed} ·
algorithm `{summary.algorithm}` · max_staleness {summary.max_staleness} · correction `{summary.correction}`

## Result

| | value |
|---|---|
| test EM before | {_fmt(summary.em_before)} |
| test EM after | {_fmt(summary.em_after)} |
| EM gain | {_fmt(summary.em_gain)} |
| learner steps | {summary.steps} |
| wall time (learner, {summary.segments} segment(s)) | {summary.wall_s:.0f} s |
| waiting for the first groups | {summary.first_wait_s:.0f} s |
| time per step (after the first) | {_fmt(summary.step_s_mean, 2)} s |
| learner tokens/s | {_fmt(summary.learner_tokens_per_s, 0)} |
| generator tokens/s | {_fmt(summary.generator_tokens_per_s, 0)} |
| tool calls (searches) per trajectory | {_fmt(summary.tool_calls_per_trajectory, 2)} |
| staleness mean / max | {_fmt(summary.staleness_mean, 2)} / {summary.staleness_max if summary.staleness_max is not None else "n/a"} |
| generator idle fraction | {_fmt(summary.generator_idle_fraction, 2)} |
| learner idle fraction | {_fmt(summary.learner_idle_fraction, 2)} |
| checkpoint | `{summary.checkpoint}` |
| checkpoints that could not be written (docs/reliability.md) | {summary.checkpoint_failures} |
{engine_update_rows(summary.engine_updates)}

## Lost work and tool errors

| | count |
|---|---|
{lost}
| tool calls in trained batches | {summary.tool_calls} |
| of which failed (error text instead of results) | {summary.tool_errors} |
| mean tool latency | {_fmt(summary.tool_latency_s, 3)} s |
| failed tool calls of the generators (trained or not) | {summary.generator_tool_errors} |
| generator pauses for tool errors | {summary.generator_tool_pauses} |

## Evaluations (greedy, test split)

| step | version | EM | tool calls/traj |
|---|---|---|---|
{evals}

## Staleness histogram (loss tokens)

{hist or "n/a"}

## Off-policy diagnostics (per step; thresholds in docs/metrics.md)

| | value |
|---|---|
{offpolicy}

![reward and EM]({plots[0].name})
![staleness]({plots[1].name})
![off-policy diagnostics]({plots[2].name})
"""
    md_path = out_dir / "report.md"
    md_path.write_text(md)
    return json_path, md_path
