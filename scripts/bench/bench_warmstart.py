"""Benchmark one warm-start step of the tiny world: transformers' forward or the lean one, one thread or two, side by side.

    python scripts/bench/bench_warmstart.py                    # every variant twice, interleaved, 20 steps each
    python scripts/bench/bench_warmstart.py --steps 30 --reps 1

Each variant runs in its own process with the world build's pinned environment (`world.PINNED_ENV`, its thread
count replaced by the variant's: the math libraries read it at load time) on seed 0's warm-start trajectories, and
reports the CPU and wall time of one optimizer step (batch 16, the build's loop, two steps of warm-up first). The
CPU time is what a build costs; with two threads it includes the time a thread spins waiting for the other, which
on a busy machine is most of it. docs/tiny-world.md quotes its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VARIANTS = (
    ("hf", 2),
    ("hf", 1),
    ("lean", 2),
    ("lean", 1),
)  # (forward, threads); ("hf", 2) is the old build's


def one(forward: str, steps: int, batch: int) -> dict[str, float]:
    """Time `steps` sft steps in this process (its environment sets the threads)."""
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    torch.use_deterministic_algorithms(True)
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    import world.warmstart as warmstart
    from retrieval.bm25 import BM25Retriever
    from retrieval.corpus import DocStore
    from world.kb import WorldSizes, build_kb, write_corpus
    from world.model import build_tiny_policy

    sizes = WorldSizes()
    with tempfile.TemporaryDirectory() as tmp:
        kb = build_kb(0, sizes)
        bm25 = BM25Retriever.build(DocStore(write_corpus(kb, Path(tmp) / "corpus.jsonl")), threads=1)
        count = batch * (steps + 2)
        trajectories = warmstart.build_trajectories(
            kb, lambda q: bm25.search(q, 3), count, sizes.good_query_share, 0
        )
        texts = warmstart.tokenizer_texts(kb, trajectories)
        out = build_tiny_policy(Path(tmp) / "model", texts, vocab_size=sizes.vocab_size, seed=0)
        tokenizer = AutoTokenizer.from_pretrained(out)
        model = Qwen2ForCausalLM.from_pretrained(out, dtype=torch.float32)
    seqs = [warmstart.tokenize_trajectory(tokenizer, t) for t in trajectories]
    if forward == "hf":  # the build's loop with transformers' own forward, as before WORLD_VERSION 5
        warmstart.lean_logprobs = warmstart.masked_logprobs
    pad = tokenizer.pad_token_id
    warmstart.sft(model, seqs[: 2 * batch], pad, epochs=1, lr=2e-3, batch_size=batch, seed=0, progress=False)
    wall, cpu = time.perf_counter(), time.process_time()
    warmstart.sft(model, seqs[2 * batch :], pad, epochs=1, lr=2e-3, batch_size=batch, seed=0, progress=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"cpu_ms": round(1000 * cpu / steps, 1), "wall_ms": round(1000 * wall / steps, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--reps", type=int, default=2, help="passes over the variants, interleaved")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # FORWARD:THREADS, in the child process
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.reps < 1:
        parser.error("--steps, --batch and --reps must be at least 1")
    if args.variant:
        forward, _ = args.variant.split(":")
        print(json.dumps(one(forward, args.steps, args.batch)))
        return 0
    from world import PINNED_ENV

    print(
        f"| pass | forward | threads | CPU ms per step | wall ms per step |  ({args.steps} steps, batch {args.batch})"
    )
    for rep in range(1, args.reps + 1):
        for forward, threads in VARIANTS:
            env = os.environ | PINNED_ENV | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
            cmd = [sys.executable, __file__, "--variant", f"{forward}:{threads}"]
            cmd += ["--steps", str(args.steps), "--batch", str(args.batch)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
            figures = json.loads(proc.stdout.strip().splitlines()[-1])
            print(
                f"| {rep} | {forward} | {threads} | {figures['cpu_ms']} | {figures['wall_ms']} |", flush=True
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
