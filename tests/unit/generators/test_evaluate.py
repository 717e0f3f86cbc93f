"""Greedy evaluation with a scripted engine."""

from __future__ import annotations

from collections import Counter

import pytest

from buffer.records import PromptRecord
from generators.evaluate import evaluate, merge_shards, select_prompts, shard
from generators.settings import GeneratorsConfig
from tasks.search_r1 import SearchR1Task
from tests.fakes.engine import ScriptedEngine


def _prompt(i: int, source: str, gold: str) -> PromptRecord:
    return PromptRecord(
        group_id=f"{source}/test/{i}/e0",
        question="q",
        prompt=[{"role": "user", "content": f"question {i}"}],
        ground_truth=[gold],
        data_source=source,
        index=i,
        split="test",
    )


async def test_evaluate_reports_em_per_source_and_searches(toy_tokenizer):
    engine = ScriptedEngine(
        toy_tokenizer,
        [],
        repeat=[
            ("<think> a </think> <search> x </search>", "stop"),
            ("<think> b </think> <answer> cedar </answer>", "stop"),
        ],
    )

    async def search(q: str) -> str:
        return "Doc 1(Title: x) y"

    prompts = [_prompt(0, "nq", "cedar"), _prompt(1, "nq", "birch"), _prompt(2, "hotpotqa", "cedar")]
    cfg = GeneratorsConfig(max_turns=2, max_tokens_per_turn=32, max_obs_tokens=32, max_response_tokens=128)
    out = await evaluate(
        engine, prompts, SearchR1Task(search=search), toy_tokenizer, cfg, max_model_len=512, chat_template=False, return_items=True,
        concurrency=1,
    )  # fmt: skip
    assert out["eval/n"] == 3
    assert out["eval/em"] == pytest.approx(2 / 3)
    assert out["eval/em/nq"] == 0.5 and out["eval/em/hotpotqa"] == 1.0
    assert out["eval/tool_calls_per_traj"] == 1.0 and out["eval/turns_mean"] == 2.0
    assert out["eval/f1/nq"] == 0.5 and out["eval/reward/hotpotqa"] == 1.0
    assert all(spec.temperature == 0.0 and not spec.logprobs for _, spec in engine.calls)
    assert [i["answer"] for i in out["items"]] == ["cedar"] * 3


def _prompts(counts: dict[str, int]) -> list[PromptRecord]:
    return [_prompt(i, source, "x") for source, n in counts.items() for i in range(n)]


def test_a_capped_evaluation_shares_the_prompts_equally_between_sources():
    prompts = _prompts({"nq": 50, "hotpotqa": 30, "bamboogle": 4})  # NQ first, as in Search-R1's test file
    picked = select_prompts(prompts, max_prompts=30, seed=0)
    by_source = Counter(p.data_source for p in picked)
    assert by_source == {
        "nq": 13,
        "hotpotqa": 13,
        "bamboogle": 4,
    }  # bamboogle's unused share goes to the others
    assert picked == sorted(picked, key=prompts.index)  # file order kept
    assert select_prompts(prompts, max_prompts=30, seed=0) == picked  # seeded: the same every time
    assert select_prompts(prompts, max_prompts=30, seed=1) != picked
    capped = select_prompts(prompts, max_per_source=10, seed=0)
    assert Counter(p.data_source for p in capped) == {"nq": 10, "hotpotqa": 10, "bamboogle": 4}
    assert select_prompts(prompts) == prompts  # no cap: every prompt
    shards = [shard(picked, i, 3) for i in range(3)]
    assert (
        sorted(sum(shards, []), key=prompts.index) == picked and len({id(p) for s in shards for p in s}) == 30
    )


def _item(group: str, source: str, em: float, sample: int = 0, reason: str = "answer") -> dict:
    return {"group_id": group, "data_source": source, "sample": sample, "metrics": {"em": em, "reward": em},
            "tool_calls": 1, "turns": 2, "finish_reason": reason}  # fmt: skip


def test_shards_merge_into_the_summary_of_one_evaluation_with_pass_at_k():
    shard_a = {"items": [_item("q1", "nq", 0.0, 0), _item("q1", "nq", 1.0, 1), _item("q2", "nq", 0.0, 0)],
               "eval/version": 7, "eval/seconds": 3.0}  # fmt: skip
    shard_b = {"items": [_item("q2", "nq", 0.0, 1, "budget"), _item("q3", "hotpotqa", 1.0, 0),
                         _item("q3", "hotpotqa", 1.0, 1)], "eval/version": 8, "eval/seconds": 5.0}  # fmt: skip
    out = merge_shards([shard_a, shard_b])
    assert out["eval/n"] == 6 and out["eval/em"] == pytest.approx(3 / 6)
    assert out["eval/pass@2/em"] == pytest.approx(2 / 3) and out["eval/pass@2/em/nq"] == 0.5
    assert out["eval/finish/budget"] == pytest.approx(1 / 6) and out["eval/n/hotpotqa"] == 2
    assert (out["eval/version"], out["eval/version_max"], out["eval/workers"]) == (7, 8, 2)
    assert out["eval/seconds"] == 5.0


async def test_sampling_several_answers_needs_sampling(toy_tokenizer):
    engine = ScriptedEngine(toy_tokenizer, [], repeat=[("<answer> cedar </answer>", "stop")])
    cfg = GeneratorsConfig(max_turns=1, max_tokens_per_turn=16, max_obs_tokens=16, max_response_tokens=32)
    with pytest.raises(ValueError, match="greedy"):
        await evaluate(engine, [_prompt(0, "nq", "cedar")], SearchR1Task(), toy_tokenizer, cfg, samples=2,
                       max_model_len=128, chat_template=False)  # fmt: skip
    out = await evaluate(engine, [_prompt(0, "nq", "cedar")], SearchR1Task(), toy_tokenizer, cfg, samples=3,
                         greedy=False, max_model_len=128, chat_template=False)  # fmt: skip
    assert out["eval/n"] == 3 and out["eval/pass@3/em"] == 1.0 and out["eval/samples"] == 3


async def test_a_baseline_answers_in_one_turn(toy_tokenizer):
    # max_turns=0: one turn that must answer; a search there ends the trajectory (the direct/RAG baselines)
    engine = ScriptedEngine(toy_tokenizer, [], repeat=[("<think> a </think> <search> x </search>", "stop")])
    cfg = GeneratorsConfig(max_turns=2, max_tokens_per_turn=32, max_obs_tokens=16, max_response_tokens=64)
    out = await evaluate(engine, [_prompt(0, "nq", "cedar")], SearchR1Task(), toy_tokenizer, cfg, max_turns=0,
                         max_model_len=256, chat_template=False)  # fmt: skip
    assert out["eval/turns_mean"] == 1.0 and out["eval/tool_calls_per_traj"] == 0.0
    assert out["eval/finish/max_turns"] == 1.0
