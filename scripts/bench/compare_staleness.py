"""Tune staleness as a user would: the tiny world at several `learner.max_staleness` bounds and corrections, on seeds.

    python scripts/bench/compare_staleness.py                             # 0/1/2/4 x none/tis/icepop x seeds 0,101,102
    python scripts/bench/compare_staleness.py --staleness 0,2 --corrections tis --seeds 0 --out runs/staleness-quick
    python scripts/bench/compare_staleness.py --report-only --out runs/compare-staleness
    python scripts/bench/compare_staleness.py --preset tiny-offpolicy --staleness 0,8,auto:1-16 --corrections none,tis \
        --out runs/compare-offpolicy                              # where staleness matters (docs/algorithms.md)

`max_staleness=0` is synchronous (on-policy): the correction does nothing there, so it runs once per seed. Every run
is a `sr1 run <preset>` of its own (`sr1/sweep.py`: finished runs are kept, an interrupted comparison continues).
`auto` in `--staleness` is `learner.max_staleness: auto` (its defaults), `auto:1-16` auto from 1 to 16. Then
`<out>/table.md` (EM before -> after, mean ± sample std and range over seeds, wall seconds, seconds per step, learner
and generator idle, mean staleness, and the off-policy diagnostics: mean off-policy KL, mean and lowest importance-weight
ESS, clipped share, the bounds in force), `<out>/results.json`, `<out>/em_vs_time.png` and `<out>/em_vs_step.png`
(greedy test EM against wall seconds since training began and against steps, one line per setting, averaged over
seeds), `<out>/offpolicy.png` (off-policy KL, ESS and the bound in force against steps, averaged over seeds) and
`<out>/staleness.png` (the share of trained tokens at each staleness, per setting). Evaluations every `--eval-every`
steps give the EM curves their points.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sr1.sweep import ROOT, Case, bound_overrides, mean_std, parse_bounds, run_sweep, save_figure  # noqa: E402

CORRECTIONS = ("none", "tis", "icepop", "decoupled")


def cases(bounds: list[int | str], corrections: list[str]) -> list[Case]:
    """One case per bound and correction (`auto` for the adaptive bound); the synchronous run once."""
    out = []
    for s in bounds:
        for c in corrections if s != 0 else ["none"]:
            overrides = [*bound_overrides(s), f"learner.correction={c}"]
            if str(s).startswith("auto"):
                name = str(s).replace(":", "")
                label = f"max_staleness auto{str(s)[4:].replace(':', ' ')}, {c}"
                out.append(Case(f"{name}-{c}", label, overrides))
            else:
                label = "sync (max_staleness 0)" if s == 0 else f"max_staleness {s}, {c}"
                out.append(Case(f"s{s}-{c}", label, overrides))
    return out


def _diagnostic(runs: list[dict], name: str, reduce=statistics.fmean) -> list[float]:
    """Per run, `reduce` over its steps of one off-policy diagnostic (runs without it are left out)."""
    out = []
    for r in runs:
        values = [c[name] for c in r.get("offpolicy", []) if c.get(name) is not None]
        if values:
            out.append(reduce(values))
    return out


def summarize(cases_: list[Case], results: dict[str, dict[int, dict]]) -> str:
    lines = [
        "| setting | EM before | EM after | gain per seed | EM after, range | wall s | s / step | learner idle "
        "| generator idle | mean staleness | off-policy KL | ESS, mean | ESS, lowest step | clipped | bound in force |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases_:
        runs = list(results.get(case.name, {}).values())
        if not runs:
            continue
        gains = ", ".join(f"{r['em_after'] - r['em_before']:+.2f}" for r in runs)
        stale = [_mean_staleness(r["staleness_histogram"]) for r in runs]
        after = [r["em_after"] for r in runs]
        kl, ess = _diagnostic(runs, "offpolicy_kl"), _diagnostic(runs, "is_ess")
        lowest, clipped = _diagnostic(runs, "is_ess", min), _diagnostic(runs, "clipped_frac")
        low, high = _diagnostic(runs, "bound", min), _diagnostic(runs, "bound", max)
        bound = f"{min(low):.0f}-{max(high):.0f}" if low else "n/a"
        lines.append(
            f"| {case.label} | {mean_std([r['em_before'] for r in runs])} | {mean_std(after)} "
            f"| {gains} | {min(after):.2f}-{max(after):.2f} | {mean_std([r['wall_s'] for r in runs], 0)} "
            f"| {mean_std([r['step_s'] for r in runs])} "
            f"| {mean_std([r['learner_idle'] for r in runs])} | {mean_std([r['generator_idle'] for r in runs])} "
            f"| {mean_std(stale)} | {_or_na(kl, 4)} | {_or_na(ess, 3)} | {_or_na(lowest, 3)} "
            f"| {_or_na(clipped, 3)} | {bound} |"
        )
    return "\n".join(lines)


def _or_na(values: list[float], digits: int) -> str:
    return mean_std(values, digits) if values else "n/a"


def _mean_staleness(histogram: dict[int, int]) -> float:
    total = sum(histogram.values())
    return sum(k * v for k, v in histogram.items()) / total if total else 0.0


def _mean_curve(curves: list[list[tuple[float, float]]]) -> tuple[list[float], list[float]]:
    """The mean over seeds at the i-th point (same steps on every seed; wall times differ a little)."""
    n = min(len(c) for c in curves)
    return (
        [statistics.fmean(c[k][0] for c in curves) for k in range(n)],
        [statistics.fmean(c[k][1] for c in curves) for k in range(n)],
    )


def plot(cases_: list[Case], results: dict[str, dict[int, dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    present = [c for c in cases_ if c.name in results]
    for key, xlabel, name in (
        ("curve_wall", "wall seconds since training began", "em_vs_time.png"),
        ("curve", "learner step", "em_vs_step.png"),
    ):
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for i, case in enumerate(present):
            curves = [r[key] for r in results[case.name].values() if r[key]]
            if curves:
                x, em = _mean_curve(curves)
                ax.plot(x, em, marker="o", markersize=3, color=f"C{i}", label=case.label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("greedy test EM (mean over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, out / name)
        plt.close(fig)

    # the off-policy diagnostics against steps, averaged over seeds
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (
        ("offpolicy_kl", "off-policy KL (k3, per token)"),
        ("is_ess", "importance-weight ESS"),
        ("bound", "staleness bound in force"),
    )
    for ax, (name, title) in zip(axes, panels, strict=True):
        for i, case in enumerate(present):
            curves = [
                [(c["step"], c[name]) for c in r.get("offpolicy", []) if c.get(name) is not None]
                for r in results[case.name].values()
            ]
            curves = [c for c in curves if c]
            if curves:
                x, y = _mean_curve(curves)
                ax.plot(x, y, color=f"C{i}", label=case.label, linewidth=1.2)
        ax.set_xlabel("learner step")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("symlog", linthresh=1e-3)
    axes[1].set_ylim(0, 1.02)
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out / "offpolicy.png")
    plt.close(fig)

    fig, axes = plt.subplots(1, len(present), figsize=(3 * len(present), 3), sharey=True, squeeze=False)
    for ax, case in zip(axes[0], present, strict=True):
        total: dict[int, int] = {}
        for r in results[case.name].values():
            for k, v in r["staleness_histogram"].items():
                total[k] = total.get(k, 0) + v
        keys = np.arange(0, max(total, default=0) + 1)
        tokens = sum(total.values()) or 1
        ax.bar(keys, [total.get(int(k), 0) / tokens for k in keys], color="tab:blue")
        ax.set_title(case.label, fontsize=8)
        ax.set_xlabel("staleness (versions)")
        ax.set_xticks(keys[:: max(1, len(keys) // 8)])
    axes[0][0].set_ylabel("share of trained tokens")
    fig.tight_layout()
    save_figure(fig, out / "staleness.png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument(
        "--preset", default="tiny", help="the preset every run starts from (tiny, tiny-offpolicy)"
    )
    parser.add_argument(
        "--staleness",
        default="0,1,2,4",
        help="comma-separated max_staleness bounds; `auto` (or `auto:FLOOR-CEILING`) for the adaptive one",
    )
    parser.add_argument("--corrections", default="none,tis,icepop", help=f"comma-separated, of {CORRECTIONS}")
    parser.add_argument("--seeds", default="0,101,102", help="comma-separated seeds")
    parser.add_argument("--eval-every", type=int, default=10, help="eval.every_steps of every run")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "compare-staleness")
    parser.add_argument(
        "--set", nargs="*", default=[], help="overrides for every run, e.g. learner.total_steps=20"
    )
    parser.add_argument("--report-only", action="store_true", help="tabulate and plot finished runs only")
    args = parser.parse_args(argv)
    try:
        bounds = parse_bounds(args.staleness)
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError as err:
        parser.error(f"--staleness takes comma-separated bounds >= 0 or auto, --seeds integers: {err}")
    corrections = [c.strip() for c in args.corrections.split(",") if c.strip()]
    unknown = [c for c in corrections if c not in CORRECTIONS]
    if unknown:
        parser.error(f"unknown corrections {unknown} (known: {', '.join(CORRECTIONS)})")
    settings = cases(bounds, corrections)
    extra = [f"eval.every_steps={args.eval_every}", *args.set]
    results = run_sweep(settings, seeds, args.out, extra, preset=args.preset, report_only=args.report_only)
    if not results:
        print("no finished runs", file=sys.stderr)
        return 1
    table = summarize(settings, results)
    conditions = (
        f"{args.preset} preset, seeds {args.seeds}, overrides {extra}; `python scripts/bench/compare_staleness.py "
        f"--preset {args.preset} --staleness {args.staleness} --corrections {args.corrections}`"
    )
    (args.out / "table.md").write_text(table + "\n\n" + conditions + "\n")
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    plot(settings, results, args.out)
    print(table)
    print(
        f"\n{conditions}\nwrote {args.out}/table.md, results.json, em_vs_time.png, em_vs_step.png, offpolicy.png, "
        "staleness.png"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
