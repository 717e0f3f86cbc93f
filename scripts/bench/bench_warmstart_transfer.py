"""Benchmark a new seed's warm start: from the shipped policy (renamed or not) against one from a random init.

    python scripts/bench/bench_warmstart_transfer.py --seed 101 --epochs 0 1 2 --scratch
    python scripts/bench/bench_warmstart_transfer.py --seed 102 --epochs 0 --questions 20

Seed S's knowledge base, corpus, questions and warm-start trajectories, as its build makes them, and three ways to
get its policy, each trained with the warm start's own loop (`world.warmstart.sft`: the same rate and schedule) and
then probed on S's test questions (`world.probe`, the behaviour `tests/integration/test_world_determinism.py`
bounds):

- `shipped tokenizer`: the shipped seed-0 policy and its tokenizer as they are, `--epochs` each;
- `renamed`: S's own tokenizer and the shipped policy with its word rows moved to S's words (`world.transfer`, what
  `build_world` does for S), `--epochs` each;
- `scratch` (with `--scratch`): S's own tokenizer and a random init, the build's 20 epochs (what every seed cost
  before the transfer; 2,500 steps, minutes).

Each row gives the steps and the CPU time of making and training the model (the tokenizer is trained once, before);
with `--scratch` the last line is each renamed row's CPU time as a share of the scratch one's. It runs in the world
build's pinned environment (`world.PINNED_ENV`, re-executing itself with it), so its weights are the build's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

FIGURES = (
    ("greedy/em", "greedy EM"),
    ("greedy/imperfect_query", "greedy first-name query"),
    ("greedy/good_query", "greedy full-name query"),
    ("forced_good/em", "EM, full-name query forced"),
    ("sampled/good_query", "sampled full-name query"),
)


def name_tokens(tokenizer, kb) -> dict[str, float]:
    """Mean tokens per first name, last name and city of `kb` under `tokenizer` (as they follow a space)."""
    from world.transfer import words

    def count(word: str) -> int:
        return len(tokenizer(" " + word, add_special_tokens=False).input_ids)

    kinds = ("first names", "last names", "cities")
    return {kind: sum(map(count, ws)) / len(ws) for kind, ws in zip(kinds, words(kb), strict=True)}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=101, help="the new seed (not 0, the shipped world's own)")
    parser.add_argument(
        "--epochs",
        type=int,
        nargs="+",
        default=[0, 1, 2],
        help="epochs after each shipped start (0: as it starts)",
    )
    parser.add_argument(
        "--scratch", action="store_true", help="also the build from a random init (20 epochs)"
    )
    parser.add_argument("--questions", type=int, default=100, help="test questions probed")
    parser.add_argument(
        "--trajectories", type=int, help="warm-start trajectories (default: the build's 2,000)"
    )
    args = parser.parse_args(argv)
    if args.seed == 0:
        parser.error("--seed must not be 0: the shipped policy was trained on seed 0's world")
    if (
        min(args.epochs) < 0
        or args.questions < 1
        or (args.trajectories is not None and args.trajectories < 1)
    ):
        parser.error("--epochs must be >= 0, --questions and --trajectories >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from world import PINNED_ENV, SHIPPED_DIR, pinned

    if not pinned():  # the math libraries read the pinning at load time: start again with it
        os.execve(
            sys.executable, [sys.executable, __file__, *(argv or sys.argv[1:])], os.environ | PINNED_ENV
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from retrieval.bm25 import BM25Retriever
    from retrieval.corpus import DocStore
    from world import TinyWorld
    from world.kb import WorldSizes, build_kb, write_corpus, write_questions
    from world.model import build_model, train_tokenizer
    from world.probe import probe_policy
    from world.transfer import transferred_policy
    from world.warmstart import build_trajectories, sft, tokenize_trajectory, tokenizer_texts

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(2)
    shipped = SHIPPED_DIR / "seed0" / "model"
    sizes = WorldSizes()
    base_kb, kb = build_kb(0, sizes), build_kb(args.seed, sizes)
    shipped_tokenizer = AutoTokenizer.from_pretrained(shipped)
    per_name = ", ".join(f"{kind} {n:.2f}" for kind, n in name_tokens(shipped_tokenizer, kb).items())
    print(f"seed {args.seed}'s words under the shipped tokenizer, tokens each: {per_name} (under its own: 1)")
    print(
        "| start | epochs | steps | CPU s | " + " | ".join(label for _, label in FIGURES) + " |", flush=True
    )
    cpu_of: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        world = TinyWorld(tmp / "corpus.jsonl", tmp / "train.parquet", tmp / "test.parquet", tmp / "model")
        write_corpus(kb, world.corpus_path)
        write_questions(kb.train, world.train_path)
        write_questions(kb.test, world.test_path)
        bm25 = BM25Retriever.build(DocStore(world.corpus_path), k1=0.9, b=0.4, threads=1)
        count = args.trajectories or sizes.num_warmstart
        trajectories = build_trajectories(
            kb, lambda queries: bm25.search(queries, 3), count, sizes.good_query_share, args.seed
        )
        own_dir = train_tokenizer(
            tokenizer_texts(kb, trajectories), tmp / "tokenizer", vocab_size=sizes.vocab_size
        )
        own_tokenizer = AutoTokenizer.from_pretrained(own_dir)

        def start(name: str):
            torch.manual_seed(args.seed)
            if name == "shipped tokenizer":
                return shipped_tokenizer, Qwen2ForCausalLM.from_pretrained(shipped, dtype=torch.float32)
            if name == "renamed":
                return own_tokenizer, transferred_policy(shipped, base_kb, own_tokenizer, kb)
            # the build's random init (world.warmstart.warm_start)
            random_dir = build_model(own_dir, tmp / "random", seed=args.seed, **sizes.model_shape)
            return own_tokenizer, Qwen2ForCausalLM.from_pretrained(random_dir, dtype=torch.float32)

        runs = [(name, e) for name in ("shipped tokenizer", "renamed") for e in args.epochs]
        runs += [("scratch", sizes.warmstart_epochs)] if args.scratch else []
        for name, epochs in runs:
            cpu = time.process_time()
            tokenizer, model = start(name)
            seqs = [tokenize_trajectory(tokenizer, t) for t in trajectories]
            steps = 0
            if epochs:
                kwargs = dict(lr=sizes.warmstart_lr, batch_size=sizes.warmstart_batch, seed=args.seed)
                steps = len(sft(model, seqs, tokenizer.pad_token_id, epochs=epochs, progress=False, **kwargs))
            cpu_of[name, epochs] = time.process_time() - cpu
            shutil.rmtree(world.model_dir, ignore_errors=True)
            model.save_pretrained(world.model_dir, safe_serialization=True)
            tokenizer.save_pretrained(world.model_dir)
            figures = asyncio.run(probe_policy(world, kb, kb.test[: args.questions], seed=args.seed))
            row = " | ".join(f"{figures[key]:.2f}" for key, _ in FIGURES)
            print(f"| {name} | {epochs} | {steps} | {cpu_of[name, epochs]:.1f} | {row} |", flush=True)
    if args.scratch:
        scratch = cpu_of["scratch", sizes.warmstart_epochs]
        shares = ", ".join(f"{e} epochs {cpu_of['renamed', e] / scratch:.3f}" for e in args.epochs)
        print(f"renamed start, CPU time as a share of the scratch build's: {shares}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
