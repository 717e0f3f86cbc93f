"""`bench_generators.py --null-engine`: how many tokens/s one generator worker process can take from an engine.

    python scripts/bench/bench_generators.py --null-engine                          # 64, 128, 256, 512 sequences
    python scripts/bench/bench_generators.py --null-engine --concurrency 512 --seconds 20 --json

An engine decodes 20-30k tokens/s on an H100 at 256-512 sequences, and the generator streams them through vLLM's
front end and the agent loop on the worker's CPU. This measures that side alone: the engine core is
`fakes.null_engine.NullEngineCore` (every step one token to every running sequence, at no cost), everything
else is what a run uses, in one process pinned to one core: `VLLMEngine.create`'s AsyncLLM (input and output
processing, detokenizer, stop strings `</search>`/`</answer>`, log-probs, weight-version labels, stats), the
`GeneratorWorker` with its agent loop and the Search-R1 task (Qwen2.5's tokenizer and chat template), a real Redis
(on the other cores) for claims, groups and heartbeats, and a publish every `--publish-every-s` seconds through
`VLLMEngine.apply_update` (pause, the weight-sync call, resume), so that versions change mid-turn as in a run.

The model's turns follow the planner profile's workload (`--profile`, sr1/plan/profiles/): lognormal turn lengths
(`tokens_per_turn`, `tokens_per_turn_cv`), a `<search>` or an `<answer>` closing each turn with the odds that give
`searches_per_trajectory` within `max_turns`, and search results of `obs_tokens_per_search` tokens. Searches are
answered in-process at once (the documents are ready text): the figure is the worker's own ceiling, with neither a
retrieval server's latency nor its CPU on the core (the HTTP client's cost per search is not in it).

At each concurrency N the engine batches at most N sequences (`max_num_seqs`) and the worker holds 2 N trajectories
(`max_inflight_groups`), so that the engine stays full although a group keeps its samples' places until its last
sample ends. Each window (`--seconds`, after `--warmup-s` to reach a steady state) reports tokens/s (wall clock),
tokens per CPU-second of the process (what a core of its own would give; less sensitive to other load), turns/s and
the sequences batched per step. The null core's own work (making each step's outputs and serialising them, the
engine-core process's job in a run) is left out of both clocks; decoding them is the front end's and is counted.
The baseline in the same run, "front end", is vLLM's front end alone: N loops that send the same turns through the
engine wrapper (`VLLMEngine.generate`) and nothing else; worker / front end (per CPU-second) is the share of that
ceiling the worker keeps, with its agent loop, search results to tokenize, Redis and publishes. Every group the worker put is read back from Redis and checked (arrays aligned, versions
-1 on observations and non-decreasing published versions on sampled tokens, log-probs <= 0). The default run takes
about four minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.bench.null_workload import NullModel, Workload, instant_search, null_model_dir, prompts  # noqa: E402


def concurrencies(text: str, flag: str = "--curve") -> list[int]:
    """A list of concurrencies given to `flag` (--curve, --concurrency): distinct increasing positive integers."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{flag} {text!r}: expected comma-separated integers, e.g. 8,32,128") from None
    if not values or values != sorted(set(values)) or values[0] < 1:
        raise SystemExit(f"{flag} {text!r}: expected distinct increasing concurrencies >= 1, e.g. 8,32,128")
    return values


def pin(core: int) -> set[int]:
    """Pin this process (and the threads it starts from now on) to `core`; returns the other allowed cores."""
    allowed = os.sched_getaffinity(0)
    if core not in allowed:
        raise SystemExit(f"--cpu-core {core}: not one of this process's cores {sorted(allowed)}")
    os.sched_setaffinity(0, {core})
    return allowed - {core} or allowed


class Window:
    """Counters at the start and the end of a measured window."""

    def __init__(self, core: Any, worker: Any = None):
        self.core, self.worker = core, worker

    def mark(self) -> dict[str, float]:
        snap = self.core.stats.snapshot() | {"cpu": time.process_time()}
        if self.worker is not None:
            snap |= {"trajectories": self.worker.trajectories_done, "searches": self.worker.tool_calls}
        return snap

    async def measure(self, args: argparse.Namespace, label: str) -> dict[str, float]:
        """Wait `warmup_s`, then the rates over `seconds`; a progress line every 5 s (on stderr)."""
        await asyncio.sleep(args.warmup_s)
        start = last = self.mark()
        end = start["time"] + args.seconds
        while (left := end - time.perf_counter()) > 0:
            await asyncio.sleep(min(5.0, left))
            now = self.mark()
            print(
                f"  {label}: {self.rates(last, now)['tokens_per_s']:,.0f} tokens/s",
                file=sys.stderr,
                flush=True,
            )
            last = now
        return self.rates(start, last)

    @staticmethod
    def rates(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        # the null core's own work (making and serialising steps, the engine-core process's job) is left out of
        # both clocks: it runs on this thread between the front end's turns
        engine, engine_cpu = b["engine_s"] - a["engine_s"], b["engine_cpu_s"] - a["engine_cpu_s"]
        wall, cpu = b["time"] - a["time"] - engine, b["cpu"] - a["cpu"] - engine_cpu
        tokens, steps = b["tokens"] - a["tokens"], max(1, b["steps"] - a["steps"])
        turns = (b["finished"] + b["aborted"]) - (a["finished"] + a["aborted"])
        out = {
            "tokens_per_s": tokens / wall,
            "tokens_per_cpu_s": tokens / max(cpu, 1e-9),
            "turns_per_s": turns / wall,
            "sequences_per_step": (b["batched"] - a["batched"]) / steps,
            "cpu_utilization": cpu / wall,
            "publishes": b["pauses"] - a["pauses"],
            "seconds": wall,
            "engine_core_seconds_left_out": engine,
        }
        if "trajectories" in a:
            out["trajectories_per_s"] = (b["trajectories"] - a["trajectories"]) / wall
            out["searches_per_s"] = (b["searches"] - a["searches"]) / wall
        return {k: round(v, 3) for k, v in out.items()}


async def _publish_every(engine: Any, period_s: float, stop: asyncio.Event) -> None:
    """The learner's publishes, as the worker's weight-sync loop applies them (pause, receive, resume), until
    `stop` (never in the middle of one)."""
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)
        if not stop.is_set():
            await engine.apply_update({"version": engine.version + 1, "epoch": 0})


async def _frontend_phase(engine: Any, n: int, args: argparse.Namespace, spec: Any) -> dict:
    """N loops calling the engine wrapper with the same turns, nothing else: vLLM's front end alone."""
    prompt = list(range(1000, 1000 + int(args.workload.prompt_tokens)))

    async def loop() -> None:
        while True:
            await engine.generate(prompt, spec)

    window = Window(engine.llm.engine_core)
    tasks = [asyncio.create_task(loop()) for _ in range(n)]
    try:
        return await window.measure(args, f"{n} sequences, front end alone")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _worker_phase(
    engine: Any, tokenizer: Any, n: int, args: argparse.Namespace, redis_url: str
) -> dict:
    from buffer.redis_buffer import ReplayBuffer
    from generators.worker import GeneratorWorker
    from tasks.search_r1 import SearchR1Task

    gen = args.cfg.generators
    groups = math.ceil(2 * n / gen.group_size)
    cfg = gen.model_copy(update={"max_inflight_groups": groups, "heartbeat_s": 1.0, "drain_timeout_s": 10.0})
    namespace = f"ceiling{n}"
    buffer = ReplayBuffer(redis_url, namespace, lease_s=120)
    # enough prompts for 200 groups/s over the whole phase (the worker must never wait for one)
    released = int(200 * (args.warmup_s + args.seconds + 5))
    buffer.release_prompts(prompts(released))
    task = SearchR1Task(args.cfg.task, search=instant_search(tokenizer, args.workload.obs_tokens_per_search))
    worker = GeneratorWorker(
        cfg,
        buffer,
        engine,
        tokenizer,
        task,
        worker_id=f"null-{n}",
        max_model_len=args.max_model_len,
        chat_template=args.cfg.model.chat_template,
    )
    window = Window(engine.llm.engine_core, worker)
    run = asyncio.create_task(worker.run())
    stop_publishing = asyncio.Event()
    publishes = asyncio.create_task(_publish_every(engine, args.publish_every_s, stop_publishing))
    try:
        rates = await window.measure(args, f"{n} sequences, worker")
    finally:
        stop_publishing.set()
        await publishes
        worker.request_stop()
        await asyncio.wait_for(run, 60)
    if worker.groups_done >= released:
        raise RuntimeError(f"the worker ran out of prompts ({released} released): raise the release count")
    rates["trajectory_check"] = await asyncio.to_thread(check_groups, buffer, worker.groups_done)
    buffer.close()
    return rates


def check_groups(buffer: Any, expected: int) -> dict[str, Any]:
    """Read back every group the worker put and check its trajectories; returns their shape."""
    import numpy as np

    seen = turns = searches = sampled = obs = mixed = 0
    finish: dict[str, int] = {}
    while seen < expected:
        taken = buffer.take(min(256, expected - seen), "ceiling-check", 2000)
        if not taken:
            raise RuntimeError(f"read back {seen} of the {expected} groups the worker put")
        for item in taken:
            item.group.validate()
            seen += 1
            for t in item.group.trajectories:
                versions = t.versions[t.loss_mask == 1]
                if np.any(np.diff(versions) < 0):
                    raise RuntimeError(f"group {item.group.group_id}: versions go backwards {versions}")
                if np.any(t.behavior_logprobs[t.loss_mask == 1] > 0):
                    raise RuntimeError(f"group {item.group.group_id}: a positive log-prob")
                turns += int(t.info["turns"])
                searches += int(t.info["tool_calls"])
                sampled += int(t.loss_mask.sum())
                obs += int((t.loss_mask == 0).sum())
                mixed += int(len(set(versions.tolist())) > 1)
                reason = str(t.info["finish_reason"])
                finish[reason] = finish.get(reason, 0) + 1
        buffer.ack([item.entry_id for item in taken])
    trajectories = sum(finish.values())
    return {
        "groups": seen,
        "trajectories": trajectories,
        "turns_per_trajectory": round(turns / max(1, trajectories), 3),
        "searches_per_trajectory": round(searches / max(1, trajectories), 3),
        "sampled_tokens_per_turn": round(sampled / max(1, turns), 1),
        "observation_tokens_per_search": round(obs / max(1, searches), 1),
        "trajectories_across_a_publish": mixed,
        "finish_reasons": finish,
    }


async def _point(
    engine: Any, tokenizer: Any, n: int, args: argparse.Namespace, spec: Any, redis_url: str
) -> dict[str, Any]:
    """The figures at `n` sequences in flight: the front end alone, then the worker."""
    engine.llm.engine_core.max_num_seqs = n
    point: dict[str, Any] = {"sequences": n}
    if args.baseline:
        point["frontend"] = await _frontend_phase(engine, n, args, spec)
    point["worker"] = await _worker_phase(engine, tokenizer, n, args, redis_url)
    if args.baseline:
        point["worker_over_frontend"] = round(
            point["worker"]["tokens_per_cpu_s"] / point["frontend"]["tokens_per_cpu_s"], 3
        )
    _progress(point)
    return point


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from fakes.null_engine import null_vllm_engine
    from generators.engine import SamplingSpec, serving_process
    from sr1.launch.redis_server import LocalRedis
    from tasks.search_r1 import protocol

    gen = args.cfg.generators
    model_dir = null_model_dir(args.cache, args.tokenizer)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = NullModel(tokenizer, args.workload, gen.max_tokens_per_turn, seed=args.seed)
    engine_cfg = gen.engine.model_copy(update={"max_num_seqs": max(args.concurrency)})
    spec = SamplingSpec(
        max_tokens=gen.max_tokens_per_turn, temperature=gen.temperature, stop=protocol.STOP_STRINGS
    )
    points = []
    with tempfile.TemporaryDirectory(prefix="sr1-null-engine-") as scratch:
        redis = LocalRedis(Path(scratch) / "redis").start()
        try:
            if args.others:  # Redis works on the other cores, as it would on another host
                os.sched_setaffinity(redis.child.process.pid, args.others)
            engine = null_vllm_engine(
                str(model_dir), engine_cfg, turns=model, max_model_len=args.max_model_len, weight_sync=False
            )
            try:
                with serving_process():  # as generators/process.py serves
                    for n in args.concurrency:
                        points.append(await _point(engine, tokenizer, n, args, spec, redis.url))
            finally:
                engine.shutdown()
        finally:
            redis.stop()
    from scripts.bench.bench_all import cpu_model

    return {
        "null_engine": points,
        "cpu": cpu_model(),
        "pinned_core": args.cpu_core,
        "date": time.strftime("%Y-%m-%d"),
        "config": args.config,
        "profile": args.profile,
        "workload": vars(args.workload) | {"search_odds_per_turn": round(args.workload.search_odds(), 3)},
        "group_size": gen.group_size,
        "seconds": args.seconds,
        "warmup_s": args.warmup_s,
        "publish_every_s": args.publish_every_s,
    }


def _progress(point: dict[str, Any]) -> None:
    w = point["worker"]
    print(
        f"{point['sequences']:>4} sequences: worker {w['tokens_per_s']:,.0f} tokens/s "
        f"({w['tokens_per_cpu_s']:,.0f} per CPU-second), {w['turns_per_s']:,.0f} turns/s"
        + (
            f", front end alone {point['frontend']['tokens_per_s']:,.0f} tokens/s"
            if "frontend" in point
            else ""
        ),
        file=sys.stderr,
        flush=True,
    )


def table(figures: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    lines = [
        "| sequences | tokens/s | tokens per CPU-s | turns/s | trajectories/s | sequences per step | "
        "front end alone, tokens/s | worker / front end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in figures["null_engine"]:
        w, f = p["worker"], p.get("frontend", {})
        lines.append(
            f"| {p['sequences']} | {w['tokens_per_s']:,.0f} | {w['tokens_per_cpu_s']:,.0f} | {w['turns_per_s']:,.0f} "
            f"| {w['trajectories_per_s']:,.1f} | {w['sequences_per_step']:,.0f} | "
            f"{f.get('tokens_per_s', float('nan')):,.0f} | {p.get('worker_over_frontend', '-')} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_generators.py --null-engine", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--null-engine", action="store_true", help="(this mode)")
    parser.add_argument(
        "--concurrency", default="64,128,256,512", help="sequences in flight, comma-separated"
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="measured window per phase")
    parser.add_argument(
        "--warmup-s", type=float, default=10.0, help="seconds before each window (steady state)"
    )
    parser.add_argument("--publish-every-s", type=float, default=2.0, help="seconds between weight publishes")
    parser.add_argument(
        "--config", default="qwen2.5-3b-8xh100", help="preset or YAML: generators and model sections"
    )
    parser.add_argument(
        "--profile", default="qwen2.5-3b-h100", help="planner profile whose workload shapes turns"
    )
    parser.add_argument(
        "--cpu-core",
        type=int,
        default=None,
        help="pin the worker to this core (default: the last one; -1: none)",
    )
    parser.add_argument(
        "--no-baseline", dest="baseline", action="store_false", help="skip the front-end phase"
    )
    parser.add_argument("--seed", type=int, default=0, help="the null model's random turns")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path("runs/.world-cache/null-qwen2.5"),
        help="the null model's directory",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="a tokenizer directory (default: Qwen2.5's, built in --cache)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. generators.group_size=8")
    args = parser.parse_args(argv)
    args.concurrency = concurrencies(args.concurrency, "--concurrency")
    for name in ("seconds", "warmup_s", "publish_every_s"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(args, name)}: expected > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM logs to stdout: keep --json's output clean
    import logging

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("vllm").setLevel(logging.WARNING)
    from config import load_config

    args.cfg = load_config(args.config, args.overrides)
    args.workload = Workload.from_profile(args.profile, args.cfg.generators.max_turns)
    args.max_model_len = args.cfg.generators.engine.max_model_len or args.cfg.model.max_seq_len
    if args.cpu_core is None:
        args.cpu_core = max(os.sched_getaffinity(0))
    args.others = pin(args.cpu_core) if args.cpu_core >= 0 else set()
    figures = asyncio.run(_run(args))
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"one generator worker, null engine ({figures['cpu']}, core {figures['pinned_core']}):")
        print(table(figures))
    return 0
