"""What the null engine's model samples and the world around it, for `bench_generators.py --null-engine`
(`scripts/bench/worker_ceiling.py`): Search-R1 turns shaped by a planner profile's workload, searches answered at once,
prompts and a model directory with Qwen2.5's tokenizer and no weights."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILLER = (
    "The question asks about the origin of the place so I recall what the passages said about its history and "
    "compare the dates and names that appear in them before I decide whether another search would help me find "
    "the answer or whether the evidence already points to one person and one year that match every clue given "
)
PASSAGE = (
    "was founded in the early years of the century by a group of merchants who settled near the river crossing and "
    "built a market hall a church and a school that later grew into the university of the region while the town "
    "itself became known for its bridges its annual fair and the printing works that published the first local "
    "newspaper"
)


@dataclass(frozen=True)
class Workload:
    """The trajectory shape, from a planner profile."""

    prompt_tokens: float
    tokens_per_turn: float
    tokens_per_turn_cv: float
    searches_per_trajectory: float
    obs_tokens_per_search: float
    max_turns: int

    @classmethod
    def from_profile(cls, name: str, max_turns: int) -> Workload:
        from sr1.plan.profile import load_profile

        w = load_profile(name).workload
        return cls(
            prompt_tokens=w.prompt_tokens.value,
            tokens_per_turn=w.tokens_per_turn.value,
            tokens_per_turn_cv=w.tokens_per_turn_cv.value,
            searches_per_trajectory=w.searches_per_trajectory.value,
            obs_tokens_per_search=w.obs_tokens_per_search.value,
            max_turns=max_turns,
        )

    def search_odds(self) -> float:
        """The chance q that a turn searches, so that min(searches before the first answer, max_turns) averages
        `searches_per_trajectory`: q + q^2 + ... + q^max_turns."""
        target = min(self.searches_per_trajectory, self.max_turns - 1e-6)
        lo, hi = 0.0, 1.0
        for _ in range(60):
            q = (lo + hi) / 2
            if sum(q**k for k in range(1, self.max_turns + 1)) < target:
                lo = q
            else:
                hi = q
        return (lo + hi) / 2


class NullModel:
    """What the null engine samples for each request: a Search-R1 turn of a lognormal length, `<think>` filler then a
    `<search>` (chance `search_odds`) or an `<answer>`; each token's log-prob drawn once per position."""

    def __init__(self, tokenizer: Any, workload: Workload, max_tokens_per_turn: int, seed: int = 0):
        import numpy as np

        encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        self.rng = np.random.default_rng(seed)
        self.head = encode("<think>")
        self.filler = encode(" " + " ".join([FILLER] * 40))
        self.search_tail = [encode(f" </think>\n<search> who founded town {i} </search>") for i in range(97)]
        self.answer_tail = encode(" </think>\n<answer> Jane Doe </answer>")
        self.q = workload.search_odds()
        cv = workload.tokens_per_turn_cv
        self.sigma = math.sqrt(math.log(1 + cv * cv))
        self.mu = math.log(workload.tokens_per_turn) - self.sigma**2 / 2
        self.max_tokens = max_tokens_per_turn
        self.logprobs = (-self.rng.exponential(0.7, size=8192)).astype(np.float32).tolist()

    def __call__(self, request: Any) -> tuple[list[int], list[float]]:
        searches = self.rng.random() < self.q
        tail = (
            self.search_tail[int(self.rng.integers(len(self.search_tail)))] if searches else self.answer_tail
        )
        length = int(self.rng.lognormal(self.mu, self.sigma))
        fill = max(1, min(length, self.max_tokens) - len(self.head) - len(tail))
        start = int(self.rng.integers(len(self.filler) - fill)) if fill < len(self.filler) else 0
        ids = self.head + self.filler[start : start + fill] + tail
        offset = int(self.rng.integers(len(self.logprobs) - len(ids)))
        return ids, self.logprobs[offset : offset + len(ids)]


def instant_search(tokenizer: Any, obs_tokens: float):
    """An in-process search answering at once with three passages that make a ~`obs_tokens` observation."""
    from retrieval.client import SearchResult
    from tasks.search_r1 import protocol

    words = PASSAGE.split()
    per_doc = max(8, int(obs_tokens / 3))
    body = " ".join(words[j % len(words)] for j in range(per_doc))
    while len(tokenizer.encode(protocol.format_documents([{"contents": f'"Town 0"\n{body}'}]))) > per_doc:
        body = body.rsplit(" ", 1)[0]
    searches = iter(range(1 << 62))

    async def search(query: str) -> SearchResult:
        # every search its own passages (numbered), so that no observation is ever the same text twice
        k = next(searches)
        docs = [{"id": f"{k}-{i}", "contents": f'"Town {k}-{i}"\n{body}'} for i in range(3)]
        return SearchResult(query=query, documents=docs, scores=[1.0, 0.9, 0.8])

    return search


def null_model_dir(cache: Path, tokenizer: Path | None = None) -> Path:
    """A tokenizer (Qwen2.5's, with its chat template, unless `tokenizer` names another) with a model config and no
    weights, in `cache` (Qwen2.5's tokenizer is built once, ~10 s)."""
    from fakes.null_engine import write_null_model
    from world.qwen import build_qwen_tokenizer

    if tokenizer is not None:
        return write_null_model(cache, tokenizer)
    if not (cache / "config.json").is_file():
        build_qwen_tokenizer(cache)
        write_null_model(cache, cache)
    return cache


def prompts(count: int) -> list:
    from buffer.records import PromptRecord, make_group_id
    from tasks.search_r1.protocol import make_prompt_messages

    records = []
    for i in range(count):
        question = f"who founded the town number {i} on the river"
        records.append(
            PromptRecord(
                group_id=make_group_id("nq", "train", i, 0),
                question=question,
                prompt=make_prompt_messages(question),
                ground_truth=["Jane Doe"],
                data_source="nq",
                index=i,
            )
        )
    return records
