"""`sr1 plan`: how to split the GPUs and which staleness bound to use, before renting them.

    sr1 plan qwen2.5-3b-8xh100 --gpus 8 --gpu-kind h100 --profile qwen2.5-3b-h100
    sr1 plan tiny --gpus 2 --gpu-kind cpu --from-run runs/tiny-20261124-101010
    sr1 plan tiny --gpus 2 --gpu-kind cpu --from-run RUN --learner-bench bench.json --json
    sr1 plan tiny --gpus 2 --gpu-kind cpu --from-run RUN --engine-bench engine.json   # the curve's shape measured
    sr1 plan PRESET [section.field=value ...] --bounds 0,1,2,4 --png plan.png
    sr1 plan search-r1-grpo-8xh100 --gpus 8 --gpu-kind h100 --profile qwen2.5-3b-h100 --fit-search-r1 133
    sr1 plan search-r1-grpo-lora-1xh100 --gpus 1 --gpu-kind h100 --profile qwen2.5-3b-h100  # LoRA, shared GPU

Simulates every split of the GPUs between the generator pool and the learner pool at each bound (docs/plan.md says
what the simulation models and what it does not) and prints steps/hour, each pool's busy fraction, the staleness
histogram and the speed-up over synchronous training, over the colocated synchronous layout and over Search-R1 as it
runs (veRL's own loop); with `learner.lora`, the LoRA learner's figures derived from the full-weight profile and
the layout where an engine and a learner rank share each GPU (docs/measurements/plan-lora-2026-11-28.md); the recommended split and bound; and where each figure of the profile came from. Exit status 2 on bad input (unknown GPU kind, a profile missing a number, a bad preset).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sr1.plan.profile import ProfileError, gpu_kind, with_figures


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sr1 plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("preset", help="a preset name or YAML path (`sr1 config presets`)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides (learner.groups_per_step=256)")
    parser.add_argument("--gpus", type=int, required=True, help="devices to split between the two pools")
    parser.add_argument("--gpu-kind", default="h100", help="h100, h200, a100-80gb, a100-40gb, l40s or cpu")
    parser.add_argument(
        "--profile", default=None, help="a profile name (sr1/plan/profiles/) or YAML/JSON file"
    )
    parser.add_argument("--from-run", type=Path, default=None, help="measure the profile from a finished run")
    parser.add_argument(
        "--learner-bench",
        type=Path,
        default=None,
        help="`bench_learner.py --json` output: the learner's tokens/s",
    )
    parser.add_argument(
        "--engine-bench",
        type=Path,
        default=None,
        help="`bench_generators.py --curve N,... --json` output: the engine's tokens/s curve (with --from-run, "
        "its shape; the run fits its scale)",
    )
    parser.add_argument(
        "--retrieval-bench",
        type=Path,
        default=None,
        help="`bench_retrieval.py --curve N,... --json` output: the retrieval server's requests/s curve",
    )
    parser.add_argument(
        "--retrieval-server",
        default=None,
        help="which curve of --retrieval-bench (dense_flat/batched, bm25/naive, ...) when it holds several",
    )
    parser.add_argument(
        "--retrieval-curve",
        default=None,
        metavar="N:RATE,...",
        help="the retrieval server's requests/s at N concurrent clients, given inline (1:40,128:45)",
    )
    parser.add_argument(
        "--figure",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="replace one figure of the profile (learner.tokens_per_s_per_rank=14480); repeatable",
    )
    parser.add_argument(
        "--fit-search-r1",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fit the profile's search_r1.trainer_mfu so that Search-R1's own loop runs this config's step in "
        "SECONDS (a published step time), then plan with it",
    )
    parser.add_argument("--bounds", default="0,1,2,4", help="max_staleness values to try, comma-separated")
    parser.add_argument("--steps", type=int, default=12, help="learner steps simulated per setting")
    parser.add_argument("--warmup", type=int, default=2, help="first simulated steps left out of the figures")
    parser.add_argument("--seed", type=int, default=0, help="seed of the simulated lengths and latencies")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--png", type=Path, default=None, help="write steps/hour per split to this PNG")
    return parser.parse_intermixed_args(argv)  # dotted overrides may stand anywhere


def _figures(items: list[str]) -> dict[str, float]:
    figures = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            figures[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--figure {item!r}: expected KEY=NUMBER (learner.tokens_per_s_per_rank=14480)")
    return figures


def _points(text: str) -> list[tuple[float, float]]:
    points = []
    for item in text.split(","):
        n, sep, rate = item.partition(":")
        try:
            points.append((float(n), float(rate)))
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(
                f"--retrieval-curve {text!r}: expected N:RATE pairs separated by commas (1:40,128:45)"
            )
    return points


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # config/ and the planner's modules import torch: `sr1 plan --help` answers without it
    from config import ConfigError, load_config
    from sr1.plan.measured import resolve_profile
    from sr1.plan.report import print_plan, save_png, to_json
    from sr1.plan.splits import fit_search_r1, make_plan

    try:
        gpu_kind(args.gpu_kind)
        bounds = [int(b) for b in args.bounds.split(",") if b.strip()]
        cfg = load_config(args.preset, args.overrides)
        profile = resolve_profile(
            args.profile,
            args.from_run,
            args.learner_bench,
            args.engine_bench,
            args.retrieval_bench,
            args.retrieval_server,
            _points(args.retrieval_curve) if args.retrieval_curve else None,
        )
        if args.figure:
            profile = with_figures(profile, _figures(args.figure))
        if args.fit_search_r1 is not None:
            if args.fit_search_r1 <= 0:
                raise ValueError(
                    f"--fit-search-r1 must be a number of seconds > 0, got {args.fit_search_r1:g}"
                )
            profile = fit_search_r1(
                cfg,
                profile,
                gpus=args.gpus,
                kind=args.gpu_kind,
                target_s=args.fit_search_r1,
                steps=args.steps,
                seed=args.seed,
            )
        plan = make_plan(
            cfg,
            profile,
            gpus=args.gpus,
            kind=args.gpu_kind,
            bounds=bounds,
            steps=args.steps,
            warmup=args.warmup,
            seed=args.seed,
            preset=str(args.preset),
        )
    except (ConfigError, ProfileError, ValueError) as err:
        print(f"sr1 plan: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_json(plan), indent=2))
    else:
        print_plan(plan)
    if args.png is not None:
        save_png(plan, args.png)
        if not args.json:
            print(f"wrote {args.png}")
    return 0 if plan.recommended is not None else 1


if __name__ == "__main__":
    sys.exit(main())
