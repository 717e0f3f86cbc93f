"""Benchmark weight sync: a full `WeightPublisher.publish` against one raw broadcast of the same bytes.

Both run in the same process group in the same run, interleaved round by round, so the ratio (publish effective
bandwidth / raw broadcast bandwidth, target >= 0.8) isolates what bucketing, packing, dtype conversion, the Redis
announcement and the acks cost. Figures are medians over `--rounds` after `--warmup` unmeasured pairs. The model is
a synthetic Qwen2-shaped set of fp32 tensors of about 100M parameters (`--quick`: about 20M), published as fp32 (the
CPU preset's dtype: large tensors go on the wire from their own memory) and as bf16 (the GPU preset's: every tensor
is converted, here on the CPU), each measured on its own with its own raw baseline.

Receivers are plain processes (joining through `fakes.receiver`) running the same receive code as the vLLM
worker extension (`weight_sync.receiver.receive_update`), without vLLM: this measures the transport, not vLLM's
reload.

The second half (skip it with --skip-learner) is the learner's throughput with sequence packing against padding on
variable-length groups (scripts/bench/bench_learner.py, target >= 1.5x), reported under "learner".

    python scripts/bench/bench_weight_sync.py [--quick] [--json] [--receivers 1] [--bucket-mb 64] [--dtype float32,bfloat16]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

NS = "bench-ws"
# a receiver gives up waiting for the learner's rendezvous or its next update after this long
RECEIVER_TIMEOUT_S = 600.0
NOTE = (
    "receivers are plain processes running weight_sync.receiver.receive_update (the vLLM extension's receive "
    "code) without vLLM: this measures the transport"
)


def qwen2_shaped(
    hidden: int, layers: int, intermediate: int, vocab: int, kv_dim: int
) -> list[tuple[str, list]]:
    """(name, shape) of a Qwen2ForCausalLM with untied embeddings, in state_dict order."""
    shapes: list[tuple[str, list]] = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", [hidden, hidden]),
            (p + "self_attn.q_proj.bias", [hidden]),
            (p + "self_attn.k_proj.weight", [kv_dim, hidden]),
            (p + "self_attn.k_proj.bias", [kv_dim]),
            (p + "self_attn.v_proj.weight", [kv_dim, hidden]),
            (p + "self_attn.v_proj.bias", [kv_dim]),
            (p + "self_attn.o_proj.weight", [hidden, hidden]),
            (p + "mlp.gate_proj.weight", [intermediate, hidden]),
            (p + "mlp.up_proj.weight", [intermediate, hidden]),
            (p + "mlp.down_proj.weight", [hidden, intermediate]),
            (p + "input_layernorm.weight", [hidden]),
            (p + "post_attention_layernorm.weight", [hidden]),
        ]
    shapes += [("model.norm.weight", [hidden]), ("lm_head.weight", [vocab, hidden])]
    return shapes


def receiver(redis_url: str, worker_id: str, rounds: int, raw_nbytes: int) -> None:
    """Join; per round: one raw broadcast of `raw_nbytes`, then one announced update (receive + ack)."""
    import torch

    from fakes.receiver import join_group, wait_update
    from weight_sync.receiver import receive_update
    from weight_sync.rendezvous import Rendezvous

    with Rendezvous(redis_url, NS) as rv:
        group, info = join_group(rv, worker_id, timeout_s=RECEIVER_TIMEOUT_S)
        raw = torch.empty(raw_nbytes, dtype=torch.uint8, device=group.device)
        pool: dict | None = {} if info.get("keep_buffers", True) else None
        for version in range(1, rounds + 1):
            group.wait(group.broadcast(raw), "raw broadcast")
            # woken by the announcement, as engines are
            deadline = time.monotonic() + RECEIVER_TIMEOUT_S
            update = wait_update(rv, group, version - 1, deadline, worker_id)
            receive_update(group, update, pool)
            rv.ack_update(version, worker_id)
        group.close()


def measure_publish(args: argparse.Namespace, tensors: list, dtype_name: str) -> dict:
    """Raw broadcast vs full publish of `tensors` as `dtype_name`, interleaved round by round (medians)."""
    import torch

    from sr1.launch.redis_server import LocalRedis
    from weight_sync.buckets import bucket_offsets, str_to_dtype
    from weight_sync.publisher import WeightPublisher
    from weight_sync.rendezvous import Rendezvous
    from weight_sync.settings import WeightSyncConfig

    rounds = args.rounds or (3 if args.quick else 5)
    total_rounds = args.warmup + rounds
    dtype = str_to_dtype(dtype_name)
    cfg = WeightSyncConfig(backend=args.backend, bucket_mb=args.bucket_mb, timeout_s=120)
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalRedis(Path(tmp)) as server,
        Rendezvous(server.url, NS) as rv,
    ):
        pub = WeightPublisher(rv, cfg, num_engines=args.receivers)
        # Raw baseline moves exactly the bytes a publish moves (alignment padding inside buckets included).
        nbytes = sum(bucket_offsets(b)[1] for b in pub.plan(tensors, dtype))
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=receiver, args=(server.url, f"recv{i}", total_rounds, nbytes), daemon=True)
            for i in range(args.receivers)
        ]
        for p in procs:
            p.start()
        pub.connect(timeout_s=120)
        group = pub.group
        raw = torch.ones(nbytes, dtype=torch.uint8, device=group.device)
        raw_s, pub_s, stats = [], [], {}
        for version in range(1, total_rounds + 1):
            start = time.perf_counter()
            group.wait(group.broadcast(raw), "raw broadcast")
            seconds = time.perf_counter() - start
            stats = pub.publish(tensors, version=version, dtype=dtype)
            if version > args.warmup:
                raw_s.append(seconds)
                pub_s.append(stats["weight_sync/seconds"])
        for p in procs:
            p.join(timeout=60)
        pub.close()
    raw_med, pub_med = statistics.median(raw_s), statistics.median(pub_s)
    return {
        "bytes": nbytes,
        "buckets": stats["weight_sync/buckets"],
        "in_place_bytes": stats["weight_sync/in_place_bytes"],
        "backend": pub.backend,
        "rounds": rounds,
        "raw_broadcast_s": raw_med,
        "publish_s": pub_med,
        "raw_broadcast_gbps": nbytes * 8 / raw_med / 1e9,
        "publish_gbps": nbytes * 8 / pub_med / 1e9,
        "ratio_publish_over_raw": raw_med / pub_med,
        "raw_broadcast_s_all": raw_s,
        "publish_s_all": pub_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="~20M parameters, 3 rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure")
    parser.add_argument("--receivers", type=int, default=1, help="number of receiving processes (engines)")
    parser.add_argument("--bucket-mb", type=float, default=64.0, help="weight_sync.bucket_mb")
    parser.add_argument(
        "--dtype",
        default="float32,bfloat16",
        help="transport dtypes, comma-separated, each measured on its own (model tensors are fp32)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="measured publish/raw pairs (median reported)"
    )
    parser.add_argument(
        "--warmup", type=int, default=1, help="unmeasured pairs first (buffers get allocated)"
    )
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--skip-learner", action="store_true", help="only the weight-sync half")
    args = parser.parse_args(argv)

    import torch

    if args.quick:
        shapes = qwen2_shaped(hidden=512, layers=4, intermediate=1408, vocab=8000, kv_dim=128)
    else:
        shapes = qwen2_shaped(hidden=768, layers=12, intermediate=2048, vocab=16000, kv_dim=256)
    g = torch.Generator().manual_seed(0)
    tensors = [(name, torch.randn(shape, generator=g)) for name, shape in shapes]
    result: dict = {
        "params": sum(t.numel() for _, t in tensors),
        "bucket_mb": args.bucket_mb,
        "receivers": args.receivers,
        "warmup_rounds": args.warmup,
        "target_ratio": 0.8,
        "note": NOTE,
        "dtypes": {name: measure_publish(args, tensors, name) for name in args.dtype.split(",")},
    }
    if not args.skip_learner:
        import scripts.bench.bench_learner as bench_learner

        result["learner"], _ = bench_learner.measure(["--quick"] if args.quick else [])
        result["learner"]["target_ratio"] = 1.5
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"weight sync benchmark ({NOTE})")
    print(
        f"  model: {result['params'] / 1e6:.1f}M fp32 params, buckets of <= {args.bucket_mb} MB, "
        f"{args.receivers} receiver(s)"
    )
    for name, fig in result["dtypes"].items():
        print(
            f"  as {name}: {fig['bytes'] / 2**20:.0f} MiB in {fig['buckets']} buckets "
            f"({fig['in_place_bytes'] / 2**20:.0f} MiB sent in place), {fig['backend']}"
        )
        print(f"    raw broadcast: {fig['raw_broadcast_s']:.3f} s  {fig['raw_broadcast_gbps']:.2f} Gbit/s")
        print(f"    full publish:  {fig['publish_s']:.3f} s  {fig['publish_gbps']:.2f} Gbit/s")
        print(f"    ratio publish/raw: {fig['ratio_publish_over_raw']:.2f} (target >= 0.8)")
    if "learner" in result:
        learner = result["learner"]
        print(
            f"learner tokens/s: packed {learner['packed/tokens_per_s']:.0f}, padded "
            f"{learner['padded/tokens_per_s']:.0f} (pad fraction {learner['padded/pad_fraction']:.2f})"
        )
        print(f"  ratio packed/padded: {learner['ratio_packed_over_padded']:.2f} (target >= 1.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
