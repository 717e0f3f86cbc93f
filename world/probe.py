"""What the warm-started tiny policy does before RL: the behaviour the tiny world promises on every machine.

    figures = asyncio.run(probe_policy(world, kb, kb.test, modes=("greedy", "forced_good")))
    figures["greedy/em"], figures["greedy/searched_and_answered"], figures["forced_good/em"]

The real agent loop (the Search-R1 task, a transformers engine, the world's BM25 index in process) runs on the given
questions in up to four modes:

- `greedy`: the policy alone at temperature 0, as `sr1 run`'s evaluation before training runs it;
- `forced_good` / `forced_imperfect`: the first turn is written for the model, searching with the full name or the
  first name only; the rest is the model's (shows that the answer-copy step works, and what the imperfect query
  costs);
- `sampled`: temperature 1 (how often sampling finds the good query that RL then reinforces).

Each mode gives exact match (`<mode>/em`) and the share of trajectories that follow the protocol
(`<mode>/searched_and_answered`: at least one search, then an answer, no invalid action); the unforced modes also give how often the model's own first query was the good or the
imperfect one. Weights are not identical across CPU vendors (the `world` package docstring says why), so this behaviour, not bytes, is
what `tests/integration/test_world_determinism.py` checks against committed bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from generators.agent import AgentSettings, run_agent
from generators.engine import Generation
from generators.hf_engine import TransformersEngine
from retrieval.bm25 import BM25Retriever
from retrieval.client import SearchResult
from retrieval.corpus import DocStore
from tasks.prompt_tokens import encode_prompt
from tasks.search_r1 import SearchR1Task
from tasks.search_r1.protocol import search_turn
from world.kb import ATTRIBUTE_BY_KEY

if TYPE_CHECKING:
    from world import TinyWorld
    from world.kb import KnowledgeBase, Question

MODES = ("greedy", "forced_good", "forced_imperfect", "sampled")


class ForcedFirstTurn:
    """An engine whose first turn is written for the model (the query under test); later turns are the model's."""

    def __init__(self, engine: Any, tokenizer: Any, first_turn: str):
        self.engine, self.first = engine, tokenizer.encode(first_turn, add_special_tokens=False)
        self.version, self._called = 0, False

    async def generate(self, prompt_ids, spec):
        if self._called:
            return await self.engine.generate(prompt_ids, spec)
        self._called = True
        return Generation(self.first, [0.0] * len(self.first), [0] * len(self.first), "stop", "</search>")


async def probe_policy(
    world: TinyWorld,
    kb: KnowledgeBase,
    questions: Sequence[Question],
    *,
    modes: Sequence[str] = MODES,
    seed: int = 0,
    answers: dict[str, list[str | None]] | None = None,
) -> dict[str, float]:
    """Exact match, protocol share and query forms of the world's policy on `questions`, per mode (see module).

    `answers`, when given, receives each mode's extracted answers in question order (None where none was given)."""
    # torch (and config/, which imports it): only when a probe runs, so `import world.probe` stays light
    import torch

    from config import load_config

    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown probe modes {sorted(unknown)}; expected some of {list(MODES)}")
    bm25 = BM25Retriever.build(DocStore(world.corpus_path), threads=1)

    async def search(query: str) -> SearchResult:
        hits = bm25.search([query], 3)[0]
        return SearchResult(query, hits.docs, hits.scores)

    task = SearchR1Task(search=search)
    engine = TransformersEngine(str(world.model_dir))
    tiny = load_config("tiny")
    settings = AgentSettings.from_config(tiny.generators, tiny.model.max_seq_len)
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one request at a time on a tiny model: more threads only wait for each other
    try:
        return await _probe_modes(kb, questions, modes, task, engine, settings, answers)
    finally:
        torch.set_num_threads(threads)


async def _probe_modes(kb, questions, modes, task, engine, settings, answers) -> dict[str, float]:
    tokenizer = engine.tokenizer
    out: dict[str, float] = {}
    for mode in modes:
        em = 0.0
        good = imperfect = protocol = 0
        for q in questions:
            ids = encode_prompt(tokenizer, task.prompt_messages(q.question), chat_template=False)
            run_engine = engine
            if mode.startswith("forced"):
                query = kb.good_query(q) if mode == "forced_good" else kb.imperfect_query(q)
                think = ATTRIBUTE_BY_KEY[q.attribute].think
                run_engine = ForcedFirstTurn(engine, tokenizer, search_turn(think, query))
            rollout = await run_agent(run_engine, ids, task, tokenizer, settings, greedy=mode != "sampled")
            score = task.score(rollout, [q.answer])
            if answers is not None:
                answers.setdefault(mode, []).append(score.metrics["answer"])
            em += score.metrics["em"]
            protocol += (
                rollout.finish_reason == "answer" and rollout.tool_calls > 0 and rollout.invalid_actions == 0
            )
            first_query = rollout.tool_inputs[0] if rollout.tool_inputs else None
            good += first_query == kb.good_query(q)
            imperfect += first_query == kb.imperfect_query(q)
        out[f"{mode}/em"] = em / len(questions)
        out[f"{mode}/searched_and_answered"] = protocol / len(questions)
        if not mode.startswith("forced"):
            out[f"{mode}/good_query"] = good / len(questions)
            out[f"{mode}/imperfect_query"] = imperfect / len(questions)
    return out
