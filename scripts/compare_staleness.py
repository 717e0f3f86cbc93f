"""Tune staleness as a user would: the tiny world at several `learner.max_staleness` bounds and corrections, on seeds.

    python scripts/compare_staleness.py                             # 0/1/2/4 x none/tis/icepop x seeds 0,101,102
    python scripts/compare_staleness.py --staleness 0,2 --corrections tis --seeds 0 --out runs/staleness-quick
    python scripts/compare_staleness.py --report-only --out runs/compare-staleness

`max_staleness=0` is synchronous (on-policy): the correction does nothing there, so it runs once per seed. Every run
is a `sr1 run tiny` of its own (`sr1/sweep.py`: finished runs are kept, an interrupted comparison continues). Then
`<out>/table.md` (EM before -> after, mean ± sample std over seeds, wall seconds, seconds per step, learner and
generator idle, mean staleness), `<out>/results.json`, `<out>/em_vs_time.png` (greedy test EM against wall seconds
since training began, one line per setting, averaged over seeds) and `<out>/staleness.png` (the share of trained
tokens at each staleness, per bound). Evaluations every `--eval-every` steps give the curves their points.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sr1.sweep import ROOT, Case, mean_std, run_sweep, save_figure  # noqa: E402

CORRECTIONS = ("none", "tis", "icepop", "decoupled")


def cases(bounds: list[int], corrections: list[str]) -> list[Case]:
    out = []
    for s in bounds:
        for c in corrections if s > 0 else ["none"]:
            label = "sync (max_staleness 0)" if s == 0 else f"max_staleness {s}, {c}"
            out.append(Case(f"s{s}-{c}", label, [f"learner.max_staleness={s}", f"learner.correction={c}"]))
    return out


def summarize(cases_: list[Case], results: dict[str, dict[int, dict]]) -> str:
    lines = [
        "| setting | EM before | EM after | gain per seed | wall s | s / step | learner idle | generator idle "
        "| mean staleness |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases_:
        runs = list(results.get(case.name, {}).values())
        if not runs:
            continue
        gains = ", ".join(f"{r['em_after'] - r['em_before']:+.2f}" for r in runs)
        stale = [_mean_staleness(r["staleness_histogram"]) for r in runs]
        lines.append(
            f"| {case.label} | {mean_std([r['em_before'] for r in runs])} | {mean_std([r['em_after'] for r in runs])} "
            f"| {gains} | {mean_std([r['wall_s'] for r in runs], 0)} | {mean_std([r['step_s'] for r in runs])} "
            f"| {mean_std([r['learner_idle'] for r in runs])} | {mean_std([r['generator_idle'] for r in runs])} "
            f"| {mean_std(stale)} |"
        )
    return "\n".join(lines)


def _mean_staleness(histogram: dict[int, int]) -> float:
    total = sum(histogram.values())
    return sum(k * v for k, v in histogram.items()) / total if total else 0.0


def plot(cases_: list[Case], results: dict[str, dict[int, dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, case in enumerate(c for c in cases_ if c.name in results):
        curves = [r["curve_wall"] for r in results[case.name].values() if r["curve_wall"]]
        if not curves:
            continue
        # average over seeds at the i-th evaluation (same steps on every seed; wall times differ a little)
        n = min(len(c) for c in curves)
        t = [statistics.fmean(c[k][0] for c in curves) for k in range(n)]
        em = [statistics.fmean(c[k][1] for c in curves) for k in range(n)]
        ax.plot(t, em, marker="o", markersize=3, color=f"C{i}", label=case.label)
    ax.set_xlabel("wall seconds since training began")
    ax.set_ylabel("greedy test EM (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out / "em_vs_time.png")
    plt.close(fig)

    bounds = sorted({int(c.name.split("-")[0][1:]) for c in cases_ if c.name in results})
    fig, axes = plt.subplots(1, len(bounds), figsize=(3 * len(bounds), 3), sharey=True, squeeze=False)
    for ax, s in zip(axes[0], bounds, strict=True):
        total: dict[int, int] = {}
        for case in (c for c in cases_ if c.name.startswith(f"s{s}-") and c.name in results):
            for r in results[case.name].values():
                for k, v in r["staleness_histogram"].items():
                    total[k] = total.get(k, 0) + v
        keys = np.arange(0, max(total, default=0) + 1)
        tokens = sum(total.values()) or 1
        ax.bar(keys, [total.get(int(k), 0) / tokens for k in keys], color="tab:blue")
        ax.set_title(f"max_staleness {s}", fontsize=9)
        ax.set_xlabel("staleness (versions)")
        ax.set_xticks(keys)
    axes[0][0].set_ylabel("share of trained tokens")
    fig.tight_layout()
    save_figure(fig, out / "staleness.png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--staleness", default="0,1,2,4", help="comma-separated max_staleness bounds")
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
        bounds = [int(s) for s in args.staleness.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError as err:
        parser.error(f"--staleness and --seeds take comma-separated integers: {err}")
    corrections = [c.strip() for c in args.corrections.split(",") if c.strip()]
    unknown = [c for c in corrections if c not in CORRECTIONS]
    if unknown or any(s < 0 for s in bounds):
        parser.error(f"unknown corrections {unknown} (known: {', '.join(CORRECTIONS)}) or a negative bound")
    settings = cases(bounds, corrections)
    extra = [f"eval.every_steps={args.eval_every}", *args.set]
    results = run_sweep(settings, seeds, args.out, extra, report_only=args.report_only)
    if not results:
        print("no finished runs", file=sys.stderr)
        return 1
    table = summarize(settings, results)
    conditions = f"tiny preset, seeds {args.seeds}, overrides {extra}; `python scripts/compare_staleness.py`"
    (args.out / "table.md").write_text(table + "\n\n" + conditions + "\n")
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    plot(settings, results, args.out)
    print(table)
    print(f"\n{conditions}\nwrote {args.out}/table.md, results.json, em_vs_time.png, staleness.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
