"""What `sr1 plan` prints and writes: a table of every split and bound, the recommendation, the profile's sources,
a JSON object with every figure, and a PNG of steps/hour against the split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sr1.plan.profile import profile_sources
from sr1.plan.splits import Plan, PlanRow
from sr1.sweep import save_figure


def _histogram(row_hist: dict[int, int]) -> str:
    total = sum(row_hist.values())
    if not total:
        return "-"
    return " ".join(f"{k}:{v / total:.0%}" for k, v in sorted(row_hist.items()))


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def to_json(plan: Plan) -> dict[str, Any]:
    """Every figure of the plan as one JSON-able object."""

    def row(r: PlanRow) -> dict[str, Any]:
        out: dict[str, Any] = {
            "generator_gpus": r.generator_gpus,
            "learner_gpus": r.learner_gpus,
            "max_staleness": r.max_staleness,
            "excluded": r.excluded,
        }
        if r.result is not None:
            res = r.result
            out |= {
                "steps_per_hour": res.steps_per_hour,
                "step_s": res.step_s,
                "generator_busy": res.generator_busy,
                "learner_busy": res.learner_busy,
                "staleness_histogram": {str(k): v for k, v in res.staleness_histogram.items()},
                "staleness_mean": res.staleness_mean,
                "speedup_vs_sync_split": r.speedup_vs_sync_split,
                "speedup_vs_colocated": r.speedup_vs_colocated,
            }
        return out

    rec = plan.recommended
    return {
        "preset": plan.preset,
        "gpus": plan.gpus,
        "gpu_kind": plan.gpu_kind,
        "profile": plan.profile.model_dump(),
        "rows": [row(r) for r in plan.rows],
        "colocated_sync": None
        if plan.colocated is None
        else {"steps_per_hour": plan.colocated.steps_per_hour, "step_s": plan.colocated.step_s},
        "colocated_excluded": plan.colocated_excluded,
        "recommended": None if rec is None else row(rec),
    }


def print_plan(plan: Plan, console=None) -> None:
    """The table, the baseline, the recommendation and the profile's sources, with rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=160)
    table = Table(title=f"sr1 plan: {plan.preset} on {plan.gpus} x {plan.gpu_kind} ({plan.profile.name})")
    for name in (
        "split",
        "bound",
        "steps/h",
        "s/step",
        "gen busy",
        "learner busy",
        "staleness (tokens)",
        "vs sync split",
        "vs colocated sync",
    ):
        table.add_column(name, justify="left" if name in ("split", "staleness (tokens)") else "right")
    shown_excluded: set[str] = set()
    for r in plan.rows:
        mark = " *" if r is plan.recommended else ""
        if r.result is None:
            if r.label not in shown_excluded:  # one line per excluded split, whatever the bound
                shown_excluded.add(r.label)
                table.add_row(r.label, "all", f"excluded: {r.excluded}", *[""] * 6)
            continue
        res = r.result
        table.add_row(
            r.label + mark,
            str(r.max_staleness),
            f"{res.steps_per_hour:,.1f}",
            f"{res.step_s:.2f}",
            f"{res.generator_busy:.2f}",
            f"{res.learner_busy:.2f}",
            _histogram(res.staleness_histogram),
            _ratio(r.speedup_vs_sync_split),
            _ratio(r.speedup_vs_colocated),
        )
    console.print(table)
    if plan.colocated is not None:
        console.print(
            f"colocated synchronous baseline (Search-R1's layout: all {plan.gpus} GPUs generate, then all train): "
            f"{plan.colocated.steps_per_hour:,.1f} steps/h ({plan.colocated.step_s:.2f} s/step)"
        )
    else:
        console.print(f"colocated synchronous baseline: excluded ({plan.colocated_excluded})")
    rec = plan.recommended
    if rec is None:
        console.print("[red]no split can run this config on this hardware (see the reasons above)[/red]")
    else:
        console.print(
            f"[bold]recommended: {rec.generator_gpus} generator GPU(s), {rec.learner_gpus} learner GPU(s), "
            f"max_staleness {rec.max_staleness}: {rec.result.steps_per_hour:,.1f} steps/h[/bold] "
            f"({_ratio(rec.speedup_vs_sync_split)} its synchronous run, {_ratio(rec.speedup_vs_colocated)} the "
            "colocated synchronous baseline)"
        )
    if (
        rec is not None
        and plan.colocated is not None
        and plan.colocated.steps_per_hour > rec.result.steps_per_hour
    ):
        console.print(
            "[yellow]the colocated synchronous layout is faster than every split here: the pools are too unequal "
            "for dedicated GPUs to pay (see each pool's busy fraction)[/yellow]"
        )
    console.print("\nprofile figures and their sources:")
    for key, value, source in profile_sources(plan.profile):
        console.print(f"  {key} = {value}  [dim]({source})[/dim]")
    for note in plan.profile.notes:
        console.print(f"  note: {note}")


def save_png(plan: Plan, path: Path) -> None:
    """Steps/hour of every split, one line per bound, with the colocated baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    bounds = sorted({r.max_staleness for r in plan.rows})
    for bound in bounds:
        rows = [r for r in plan.rows if r.max_staleness == bound and r.result is not None]
        if rows:
            ax.plot(
                [r.generator_gpus for r in rows],
                [r.result.steps_per_hour for r in rows],
                marker="o",
                label=f"max_staleness {bound}" + (" (sync)" if bound == 0 else ""),
            )
    if plan.colocated is not None:
        ax.axhline(plan.colocated.steps_per_hour, color="tab:gray", linestyle="--", label="colocated sync")
    if plan.recommended is not None:
        rec = plan.recommended
        ax.scatter(
            [rec.generator_gpus],
            [rec.result.steps_per_hour],
            s=160,
            facecolors="none",
            edgecolors="tab:red",
            label="recommended",
            zorder=3,
        )
    ax.set_xticks(sorted({r.generator_gpus for r in plan.rows}))
    ax.set_xlabel(f"generator GPUs (of {plan.gpus}; the rest train)")
    ax.set_ylabel("steps / hour (simulated)")
    ax.set_title(f"{plan.preset} on {plan.gpus} x {plan.gpu_kind}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    plt.close(fig)
