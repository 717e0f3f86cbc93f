"""Build the tiny world of the embedded default into a directory, and check that it leaves room for RL.

    python scripts/tiny_world.py --out runs/tiny_world --seed 0            # corpus, parquet, warm-started model
    python scripts/tiny_world.py --out runs/tiny_world --check             # + greedy / forced-query exact match
    python scripts/tiny_world.py --set hidden_size=256 --set num_people=200   # other sizes (WorldSizes fields)

The output directory holds `corpus.jsonl` (Search-R1 wiki-18 JSONL), `train.parquet` / `test.parquet` (Search-R1
layout), `model/` (HF safetensors + tokenizer) and `tiny_world.json` (the parameters; a second run with the same
ones returns at once).

`--check` runs the real agent loop (the Search-R1 task, a transformers engine, the world's BM25 index in process) on
test questions: greedy, with the first turn forced to search with the full name ("good": shows the answer-copy
step works) or the first name only ("imperfect"), and sampled at temperature 1. It reports exact match and how
often the model's own query was the good or the imperfect one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _parse_sets(items: list[str]) -> dict[str, object]:
    from sr1.world import WorldSizes

    defaults = WorldSizes()
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not hasattr(defaults, key):
            names = sorted(vars(defaults))
            raise SystemExit(f"--set expects FIELD=VALUE with FIELD one of {names}; got {item!r}")
        kind = type(getattr(defaults, key))
        if kind is bool:
            out[key] = value.lower() in ("1", "true", "yes")
        else:
            out[key] = kind(value)
    return out


class ForcedFirstTurn:
    """An engine whose first turn is written for the model (the query under test); later turns are the model's."""

    def __init__(self, engine, tokenizer, first_turn: str):
        self.engine, self.first = engine, tokenizer.encode(first_turn, add_special_tokens=False)
        self.version, self._called = 0, False

    async def generate(self, prompt_ids, spec):
        from generators.engine import Generation

        if self._called:
            return await self.engine.generate(prompt_ids, spec)
        self._called = True
        return Generation(self.first, [0.0] * len(self.first), [0] * len(self.first), "stop", "</search>")


async def check(world, kb, questions, *, seed: int) -> dict[str, float]:
    """Exact match and query forms of the warm-started policy: greedy, forced good / imperfect query, sampled."""
    import torch

    from config import load_config
    from generators.agent import AgentSettings, encode_prompt, run_agent
    from generators.hf_engine import TransformersEngine
    from retrieval.bm25 import BM25Retriever
    from retrieval.client import SearchResult
    from retrieval.corpus import DocStore
    from sr1.world.kb import ATTRIBUTE_BY_KEY
    from tasks.search_r1 import SearchR1Task
    from tasks.search_r1.protocol import search_turn

    bm25 = BM25Retriever.build(DocStore(world.corpus_path), threads=1)

    async def search(query: str) -> SearchResult:
        hits = bm25.search([query], 3)[0]
        return SearchResult(query, hits.docs, hits.scores)

    task = SearchR1Task(search=search)
    engine = TransformersEngine(str(world.model_dir))
    tokenizer = engine.tokenizer
    tiny = load_config("tiny")
    settings = AgentSettings.from_config(tiny.generators, tiny.model.max_seq_len)
    torch.manual_seed(seed)
    out: dict[str, float] = {}
    for mode in ("greedy", "forced_good", "forced_imperfect", "sampled"):
        em, good, imperfect = 0.0, 0, 0
        for q in questions:
            ids = encode_prompt(tokenizer, task.prompt_messages(q.question), chat_template=False)
            run_engine = engine
            if mode.startswith("forced"):
                query = kb.good_query(q) if mode == "forced_good" else kb.imperfect_query(q)
                run_engine = ForcedFirstTurn(
                    engine, tokenizer, search_turn(ATTRIBUTE_BY_KEY[q.attribute].think, query)
                )
            rollout = await run_agent(run_engine, ids, task, tokenizer, settings, greedy=mode != "sampled")
            em += task.score(rollout, [q.answer]).metrics["em"]
            first_query = rollout.tool_inputs[0] if rollout.tool_inputs else None
            good += first_query == kb.good_query(q)
            imperfect += first_query == kb.imperfect_query(q)
        out[f"{mode}/em"] = em / len(questions)
        if not mode.startswith("forced"):
            out[f"{mode}/good_query"] = good / len(questions)
            out[f"{mode}/imperfect_query"] = imperfect / len(questions)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/tiny_world"), help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="world and model seed")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a WorldSizes field"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when the directory is up to date")
    parser.add_argument(
        "--check", action="store_true", help="evaluate the warm-started policy on test questions"
    )
    parser.add_argument("--questions", type=int, default=100, help="test questions for --check")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)

    import logging

    from rich.logging import RichHandler

    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(show_path=False)])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from sr1.world import MARKER_FILE, WorldSizes, build_world
    from sr1.world.kb import build_kb

    sizes = _parse_sets(args.set)
    if args.force:
        (args.out / MARKER_FILE).unlink(missing_ok=True)
    start = time.perf_counter()
    world = build_world(args.out, args.seed, progress=True, **sizes)
    figures: dict[str, object] = {"seed": args.seed, "build_s": round(time.perf_counter() - start, 1)}
    figures.update({k: str(v) for k, v in vars(world).items()})
    if args.check:
        kb = build_kb(args.seed, WorldSizes(**sizes))
        figures["check"] = asyncio.run(check(world, kb, kb.test[: args.questions], seed=args.seed))
    if args.json:
        print(json.dumps(figures))
    else:
        from rich import print_json

        print_json(data=figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
