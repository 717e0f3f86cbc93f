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
            "shared": r.shared,
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
                "speedup_vs_search_r1": r.speedup_vs_search_r1,
                "worker_bound": res.worker_bound,
                "retrieval_busy": res.retrieval_busy,
                "search_wait_s": res.search_wait_s,
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
        "search_r1": None
        if plan.search_r1 is None
        else {
            "steps_per_hour": plan.search_r1.steps_per_hour,
            "step_s": plan.search_r1.step_s,
            "phases_s": plan.search_r1.phases,
            "generate_calls": plan.search_r1.generate_calls,
            "fitted": fitted_figures(plan),
        },
        "search_r1_excluded": plan.search_r1_excluded,
        "shared_excluded": plan.shared_excluded,
        "lora": None if plan.lora is None else plan.lora | _pauses(plan),
        "shared_learner_tokens_per_s_per_rank": None
        if plan.shared_profile is None
        else plan.shared_profile.learner.tokens_per_s_per_rank.value,
        "recommended": None if rec is None else row(rec),
    }


def _pauses(plan: Plan) -> dict[str, float]:
    """Seconds each update stops an engine's decoding, with LoRA and with the full weights it replaces."""
    full, pause = plan.full_profile, plan.profile.engine_pause_s
    return {
        "engine_pause_s": plan.profile.weight_sync_s.value if pause is None else pause.value,
        "full_weight_engine_pause_s": None
        if full.lora
        else (full.engine_pause_s or full.weight_sync_s).value,
    }


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _print_lora(plan: Plan, console) -> None:
    """The adapter against the full weights, and the layout where an engine and a rank share each GPU."""
    if plan.shared_excluded is not None:
        console.print(
            f"shared layout (an engine and a learner rank on each GPU): excluded: {plan.shared_excluded}"
        )
    if plan.lora is None:
        return
    lora, pauses = plan.lora, _pauses(plan)
    full = plan.full_profile.learner.tokens_per_s_per_rank.value
    console.print(
        f"LoRA: {lora['adapter_parameters'] / 1e6:.1f}M adapter parameters ({lora['bytes_share']:.2%} of the "
        f"model); {_size(lora['adapter_bytes'])} per update against {_size(lora['full_bytes'])} of "
        f"full weights; engine pause per update {pauses['engine_pause_s']:g} s (full weights: "
        f"{pauses['full_weight_engine_pause_s'] or '-'} s); learner "
        f"{plan.profile.learner.tokens_per_s_per_rank.value:,.0f} tokens/s per rank (full weights: "
        f"{'-' if plan.full_profile.lora else f'{full:,.0f}'}; see the sources below)"
    )
    shared = plan.shared_profile
    if shared is not None and plan.shared_excluded is None and shared is not plan.profile:
        console.print(
            f"  the shared layout's learner, in what the engine's share leaves it: "
            f"{shared.learner.tokens_per_s_per_rank.value:,.0f} tokens/s per rank alone, x "
            f"{shared.shared_gpu_speed.value:g} while the engine is busy ({shared.learner.activation_gib.source})"
        )


def fitted_figures(plan: Plan) -> list[str]:
    """The profile's figures that were fitted (their source says so), as `name = value`."""
    return [
        f"{key} = {value}"
        for key, value, source in profile_sources(plan.profile)
        if source.startswith("fitted")
    ]


# a row is search-bound when its retrieval server is this busy, or a search waits this long for it on average
SEARCH_BOUND_BUSY = 0.9
# a split is called worker-bound when its engines could outrun their workers this share of the time
WORKER_BOUND_SHARE = 0.05


def print_plan(plan: Plan, console=None) -> None:
    """The table, the baseline, the recommendation and the profile's sources, with rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=200)
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
        "vs Search-R1 as it runs",
        *(["search wait s"] if plan.profile.retrieval else []),
        *(["worker-bound"] if plan.profile.generator.worker_tokens_per_s else []),
    ):
        left = name in ("split", "staleness (tokens)")
        table.add_column(name, justify="left" if left else "right", no_wrap=left)
    excluded: dict[str, str] = {}  # one line per excluded split, whatever the bound, under the table
    for r in plan.rows:
        mark = " *" if r is plan.recommended else ""
        if r.result is None:
            excluded.setdefault(r.label, r.excluded)
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
            _ratio(r.speedup_vs_search_r1),
            *([f"{res.search_wait_s:.2f}"] if plan.profile.retrieval else []),
            *([f"{res.worker_bound:.2f}"] if plan.profile.generator.worker_tokens_per_s else []),
        )
    console.print(table)
    for label, why in excluded.items():
        console.print(f"{label}: excluded: {why}")
    if plan.colocated is not None:
        console.print(
            f"colocated synchronous baseline (sr1's engines and learner on all {plan.gpus} GPUs: generate, then train): "
            f"{plan.colocated.steps_per_hour:,.1f} steps/h ({plan.colocated.step_s:.2f} s/step)"
        )
    else:
        console.print(f"colocated synchronous baseline: excluded ({plan.colocated_excluded})")
    _print_search_r1(plan, console)
    _print_lora(plan, console)
    rec = plan.recommended
    if rec is None:
        console.print("[red]no split can run this config on this hardware (see the reasons above)[/red]")
    else:
        console.print(
            f"[bold]recommended: {rec.label + ', ' if rec.shared else ''}{rec.generator_gpus} generator GPU(s), "
            f"{rec.learner_gpus} learner GPU(s), "
            f"max_staleness {rec.max_staleness}: {rec.result.steps_per_hour:,.1f} steps/h[/bold] "
            f"({_ratio(rec.speedup_vs_sync_split)} its synchronous run, {_ratio(rec.speedup_vs_colocated)} the "
            "colocated synchronous baseline"
            + (f", {_ratio(rec.speedup_vs_search_r1)} Search-R1 as it runs)" if plan.search_r1 else ")")
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
    _print_bounds(plan, console)
    console.print("\nprofile figures and their sources:")
    for key, value, source in profile_sources(plan.profile):
        console.print(f"  {key} = {value}  [dim]({source})[/dim]")
    for note in plan.profile.notes:
        console.print(f"  note: {note}")


def _print_search_r1(plan: Plan, console) -> None:
    base = plan.search_r1
    if base is None:
        console.print(f"Search-R1 as it runs: left out ({plan.search_r1_excluded})")
        return
    parts = ", ".join(f"{name} {seconds:.1f}" for name, seconds in base.phases.items() if seconds > 0)
    console.print(
        f"Search-R1 as it runs (veRL's synchronous multi-turn loop on all {plan.gpus} GPUs, sr1/plan/search_r1.py): "
        f"{base.steps_per_hour:,.1f} steps/h ({base.step_s:.1f} s/step: {parts} s; "
        f"{base.generate_calls:.1f} generate calls per step)"
    )
    fitted = fitted_figures(plan)
    console.print(
        "  calibrated: "
        + ("; ".join(fitted) if fitted else "no figure of this profile was fitted")
        + " (every other figure is an assumption or a measurement: see the sources below)"
    )


def _print_bounds(plan: Plan, console) -> None:
    """A line for the splits that search, or their workers, bound."""
    ran = [r for r in plan.rows if r.result is not None]
    searching = [
        r
        for r in ran
        if r.result.retrieval_busy is not None
        and (
            r.result.retrieval_busy >= SEARCH_BOUND_BUSY
            or r.result.search_wait_s > plan.profile.workload.search_latency_s.value
        )
    ]
    if searching:
        worst = max(searching, key=lambda r: r.result.search_wait_s)
        console.print(
            f"[yellow]search-bound: in {len(searching)} row(s) the retrieval server, not the engines, bounds the "
            f"generator pool (at {worst.label}, bound {worst.max_staleness}: busy {worst.result.retrieval_busy:.0%} "
            f"of the time, a search waits {worst.result.search_wait_s:.2f} s for it on average)[/yellow]"
        )
    bound = [r for r in ran if r.result.worker_bound >= WORKER_BOUND_SHARE]
    if bound:
        ceiling = plan.profile.generator.worker_tokens_per_s.value
        labels = sorted({r.label for r in bound})
        console.print(
            f"[yellow]worker-bound: with {', '.join(labels)} the engines could outrun their worker processes "
            f"({ceiling:,.0f} tokens/s each, generator.worker_tokens_per_s) for part of the time; the figures "
            "above are capped at it[/yellow]"
        )


def save_png(plan: Plan, path: Path) -> None:
    """Steps/hour of every split, one line per bound, with the colocated baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    bounds = sorted({r.max_staleness for r in plan.rows})
    for i, bound in enumerate(bounds):
        rows = [r for r in plan.rows if r.max_staleness == bound and r.result is not None and not r.shared]
        shared = [r for r in plan.rows if r.max_staleness == bound and r.result is not None and r.shared]
        for r in shared:  # an engine and a rank on every GPU: a point of its own at the right
            ax.scatter(
                [plan.gpus],
                [r.result.steps_per_hour],
                marker="s",
                color=f"C{i}",
                label=f"shared, bound {bound}",
            )
        if rows:
            ax.plot(
                [r.generator_gpus for r in rows],
                [r.result.steps_per_hour for r in rows],
                marker="o",
                color=f"C{i}",
                label=f"max_staleness {bound}" + (" (sync)" if bound == 0 else ""),
            )
    if plan.colocated is not None:
        ax.axhline(plan.colocated.steps_per_hour, color="tab:gray", linestyle="--", label="colocated sync")
    if plan.search_r1 is not None:
        ax.axhline(
            plan.search_r1.steps_per_hour, color="tab:brown", linestyle=":", label="Search-R1 as it runs"
        )
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
    ax.set_xlabel(f"generator GPUs (of {plan.gpus}; the rest train; at {plan.gpus}: shared)")
    ax.set_ylabel("steps / hour (simulated)")
    ax.set_title(f"{plan.preset} on {plan.gpus} x {plan.gpu_kind}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    plt.close(fig)
