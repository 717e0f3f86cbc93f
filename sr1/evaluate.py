"""`sr1 eval`: evaluate any checkpoint on test files, per data source, with search or one of the paper's baselines.

    sr1 eval --run-dir runs/tiny-20261122-1200                 # the run's latest checkpoint, on its test files
    sr1 eval --checkpoint runs/x/checkpoints/step_200 --test-files data/search_r1/test.parquet --max-per-source 500
    sr1 eval --checkpoint Qwen/Qwen2.5-3B-Instruct --test-files test.parquet --mode rag --engines 2
    sr1 eval --run-dir runs/x --samples 4                       # pass@4 (sampled at generators.temperature)

Modes: `search` (the agent loop: reason, search, answer), `direct` (answer at once, no retrieval) and `rag` (one
retrieval for the question up front, then answer): the Search-R1 paper's two baselines beside its method. Every
test prompt is evaluated unless `--max-per-source` / `--max-prompts` pick a stratified, seeded sample. Prompts are
split over `--engines` vLLM engines (`--engine hf`: transformers in this process) whose weights never change.

Writes `<out>/eval.json` (the summary, the per-source table and every item), `eval.md` and `eval.png` (EM per
source), prints the table, and logs to wandb when the config enables it (the run's own wandb run with `--run-dir`).
The retrieval server at `retrieval.client.url` is used when it answers; otherwise, if the config serves a local index
(BM25 or dense), one is started for the evaluation and stopped after.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from common.model_paths import ModelPathError, resolve_model_path
from common.secrets import mask_url
from evaluation import shard
from evaluation.prompts import select_prompts
from evaluation.report import format_value, markdown, per_source_table, plot, summarize
from generators.engine import VLLMEngine
from generators.evaluation import answer_shard
from generators.hf_engine import TransformersEngine
from learner.tracking import Tracker
from sr1 import entrypoints
from tasks import build_task
from tasks.search_r1.data import DataError

MODES = ("search", "direct", "rag")


class EvalInputError(ValueError):
    """Bad input to `sr1 eval` (a missing file, no checkpoint, no test files); the message says which."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sr1 eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--checkpoint", help="HF model directory (a run's checkpoints/step_N) or a cached hub id"
    )
    which.add_argument("--run-dir", type=Path, help="a run directory: its latest checkpoint and its config")
    parser.add_argument(
        "--config", help="preset or YAML (default: the run's config.yaml, else the tiny preset)"
    )
    parser.add_argument("--test-files", nargs="+", type=Path, help="test files (default: data.test_files)")
    parser.add_argument("--mode", choices=MODES, default="search")
    parser.add_argument("--max-per-source", type=int, help="at most this many prompts per data source")
    parser.add_argument("--max-prompts", type=int, help="at most this many prompts, shared between sources")
    parser.add_argument(
        "--samples", type=int, default=1, help="answers per prompt (>1: sampled, with pass@k)"
    )
    parser.add_argument("--engines", type=int, default=1, help="vLLM engines sharing the prompts")
    parser.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--retrieval-url", help="POST /retrieve endpoint (default: retrieval.client.url)")
    parser.add_argument("--out", type=Path, help="output directory (default: <checkpoint>/eval-<mode>)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_intermixed_args(argv)
    for name in ("max_per_source", "max_prompts", "samples", "engines"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return args


def _checkpoint_and_config(args: argparse.Namespace):
    """The checkpoint directory to evaluate and the config to evaluate it with."""
    # config/ and learner/ import torch: after --help has answered
    from config import load_config
    from learner.checkpoints.checkpointer import latest_checkpoint

    run_dir = args.run_dir
    if run_dir is not None:
        checkpoint = latest_checkpoint(run_dir / "checkpoints")
        if checkpoint is None:
            raise EvalInputError(f"{run_dir} has no complete checkpoint (checkpoints/latest)")
    else:
        checkpoint = resolve_model_path(args.checkpoint, what="--checkpoint")
        if (checkpoint.parent.parent / "config.yaml").is_file():  # <run_dir>/checkpoints/step_N
            run_dir = checkpoint.parent.parent
    if args.config:
        cfg = load_config(args.config, args.overrides)
    elif run_dir is not None and (run_dir / "config.yaml").is_file():
        cfg = load_config(run_dir / "config.yaml", args.overrides)
    else:
        cfg = load_config("tiny", args.overrides)
    return Path(checkpoint), cfg, run_dir


def _version_of(checkpoint: Path) -> int:
    state = checkpoint / "resume" / "state.json"
    if state.is_file():
        return int(json.loads(state.read_text()).get("version", 0))
    return 0


# -- the evaluation -----------------------------------------------------------------------------------------------


async def _baseline_prompts(prompts: list, task: Any, mode: str) -> list:
    """The prompts rewritten for a baseline: no search instruction (`direct`), or the passages retrieved for the
    question put in front of it (`rag`)."""
    import dataclasses

    if mode == "search":
        return prompts
    contexts = [""] * len(prompts)
    if mode == "rag":
        contexts = list(await asyncio.gather(*(task.retrieve_context(p.question) for p in prompts)))
    return [
        dataclasses.replace(p, prompt=task.baseline_messages(p.question, mode, c))
        for p, c in zip(prompts, contexts, strict=True)
    ]


async def _evaluate(
    args, cfg, checkpoint: Path, prompts: list, retrieval_url: str | None
) -> tuple[list, float]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    retrieval = cfg.retrieval.sending_to(retrieval_url) if retrieval_url else None
    task = build_task(cfg.task, retrieval=retrieval)
    engines, tokenizer = _start_engines(args, cfg, checkpoint)
    started = time.monotonic()
    try:
        prompts = await _baseline_prompts(prompts, task, args.mode)
        items: list[dict] = []
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns, transient=False) as progress:
            bar = progress.add_task(f"eval ({args.mode})", total=len(prompts) * args.samples)

            def done(item: dict) -> None:
                items.append(item)
                progress.advance(bar)

            max_turns = 0 if args.mode != "search" else cfg.eval.max_turns
            await asyncio.gather(
                *(
                    answer_shard(
                        engine,
                        shard(prompts, i, len(engines)),
                        task,
                        tokenizer,
                        cfg.generators,
                        greedy=args.samples == 1,
                        samples=args.samples,
                        max_model_len=cfg.model.max_seq_len,
                        max_turns=max_turns,
                        chat_template=cfg.model.chat_template,
                        on_item=done,
                    )
                    for i, engine in enumerate(engines)
                )
            )
    finally:
        await task.close()
        for engine in engines:
            if hasattr(engine, "shutdown"):
                engine.shutdown()
        engines.clear()
        gc.collect()  # the engines' finalizers run now, not at interpreter exit (where they print a traceback)
    return items, time.monotonic() - started


def _start_engines(args, cfg, checkpoint: Path) -> tuple[list, Any]:
    if args.engine == "hf":
        engines = [TransformersEngine(str(checkpoint)) for _ in range(args.engines)]
        return engines, engines[0].tokenizer
    from transformers import AutoTokenizer

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the progress bar, not the engine's request log

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    engines = [
        VLLMEngine.create(
            str(checkpoint),
            cfg.generators.engine,
            dtype=cfg.model.dtype,
            max_model_len=cfg.model.max_seq_len,
            seed_offset=i,
            weight_sync=False,
        )
        for i in range(args.engines)
    ]
    return engines, tokenizer


# -- the report -----------------------------------------------------------------------------------------------------


def _write(out: Path, name: str, text: str) -> None:
    tmp = out / f".{name}.tmp"
    tmp.write_text(text)
    tmp.replace(out / name)


def _print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="evaluation per data source")
    for col in (
        "source",
        "n",
        "EM",
        "F1",
        *(["pass@k EM"] if any("pass@k" in r for r in rows) else []),
        "searches/q",
        "turns",
        "finish",
    ):
        table.add_column(col)
    for r in rows:
        passk = [format_value(r.get("pass@k"))] if any("pass@k" in x for x in rows) else []
        table.add_row(
            r["source"],
            str(r["n"]),
            format_value(r["em"]),
            format_value(r["f1"]),
            *passk,
            f"{r['searches']:.2f}",
            f"{r['turns']:.2f}",
            r["finish"],
        )
    Console().print(table)


# -- the command ------------------------------------------------------------------------------------------------------


def _retrieval_for(args, cfg, supervisor) -> str | None:
    """A retrieval endpoint that answers: the given/configured one, or a local server started for the evaluation."""
    # torch, through config (the supervisor imports it too): not for --help
    from config import save_job, secret_env
    from sr1.launch.supervisor import Child, free_port, http_ok, python_module

    if args.mode == "direct":
        return None
    url = args.retrieval_url or cfg.retrieval.client.url
    if http_ok(url.rsplit("/", 1)[0] + "/health"):
        return url
    if args.retrieval_url or not cfg.retrieval.serves_locally:
        raise EvalInputError(
            f"no retrieval server answers at {mask_url(url)} (start one with `sr1 retrieval serve`)"
        )
    port = free_port()
    local = cfg.retrieval.served_at(port)
    out = args.out_dir
    job = cfg.model_copy(update={"retrieval": local, "run_dir": out}).retrieval_job()
    job_file = save_job(job, out / "retrieval.yaml")  # its token masked: given in the environment
    supervisor.start(
        Child(
            "retrieval",
            python_module(entrypoints.RETRIEVAL, "serve", "--config", str(job_file)),
            out / "retrieval.log",
            secret_env(job),
        )
    )
    print(
        f"sr1 eval: starting a retrieval server on port {port} ({cfg.retrieval.retriever.method})",
        file=sys.stderr,
    )
    supervisor.wait_until(
        lambda: http_ok(f"http://127.0.0.1:{port}/health"), timeout_s=600, what="the retrieval server"
    )
    return local.client.url


def run_eval(args: argparse.Namespace) -> dict[str, Any]:
    from sr1.launch.supervisor import Supervisor  # torch, through config: not for --help

    checkpoint, cfg, run_dir = _checkpoint_and_config(args)
    test_files = args.test_files or cfg.data.test_files
    if not test_files:
        raise EvalInputError("no test files: give --test-files, or a config whose data.test_files names some")
    missing = [str(f) for f in test_files if not Path(f).is_file()]
    if missing:
        raise EvalInputError(f"test file(s) not found: {', '.join(missing)}")
    args.out_dir = out = Path(args.out or checkpoint / f"eval-{args.mode}")
    out.mkdir(parents=True, exist_ok=True)
    prompts = build_task(cfg.task).load_prompts(test_files, split="test")
    prompts = select_prompts(
        prompts, max_prompts=args.max_prompts, max_per_source=args.max_per_source, seed=cfg.seed
    )
    supervisor = Supervisor()
    try:
        retrieval_url = _retrieval_for(args, cfg, supervisor)
        items, seconds = asyncio.run(_evaluate(args, cfg, checkpoint, prompts, retrieval_url))
    finally:
        supervisor.stop(["retrieval"])
    version = _version_of(checkpoint)
    summary = summarize(items) | {"eval/version": version, "eval/seconds": seconds}
    rows = per_source_table(items, summary)
    header = {
        "checkpoint": str(checkpoint),
        "version": version,
        "mode": args.mode,
        "prompts": len(prompts),
        "samples": args.samples,
        "decoding": "greedy" if args.samples == 1 else f"sampled at temperature {cfg.generators.temperature}",
        "test files": ", ".join(map(str, test_files)),
        "engines": f"{args.engines} × {args.engine}",
        "seconds": round(seconds, 1),
        "date": time.strftime("%Y-%m-%d"),
    }
    record = {"header": header, "summary": summary, "per_source": rows, "items": items}
    _write(out, "eval.json", json.dumps(record, indent=1) + "\n")
    _write(out, "eval.md", markdown(rows, header))
    plot(rows, out / "eval.png", f"{checkpoint.name} · {args.mode} · {len(prompts)} prompts")
    _print_table(rows)
    print(f"wrote {out / 'eval.json'}, {out / 'eval.md'}, {out / 'eval.png'}")
    if cfg.logging.wandb:
        tracker = Tracker(run_dir or out, cfg.logging, metrics_file=False)
        tracker.log_eval(summary, step=version)
        tracker.close()
    return summary


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from config import ConfigError  # torch, through config: after --help

    try:
        summary = run_eval(args)
    except (ConfigError, ModelPathError, DataError, EvalInputError) as err:
        print(f"sr1 eval: {err}", file=sys.stderr)
        return 2
    print(f"EM {summary.get('eval/em', 0.0):.3f} over {int(summary['eval/n'])} answers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
