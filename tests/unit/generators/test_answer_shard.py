"""Greedy evaluation with a scripted engine."""

from __future__ import annotations

import pytest

from buffer.records import PromptRecord
from generators.evaluation import answer_shard
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


async def _answer(engine, prompts, tokenizer, cfg, task=None, **options) -> dict:
    """`answer_shard` with the Search-R1 task, no chat template, and this test's options."""
    return await answer_shard(
        engine, prompts, task or SearchR1Task(), tokenizer, cfg, chat_template=False, **options
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
    out = await _answer(
        engine,
        prompts,
        toy_tokenizer,
        cfg,
        SearchR1Task(search=search),
        max_model_len=512,
        return_items=True,
        concurrency=1,
    )
    assert out["eval/n"] == 3
    assert out["eval/em"] == pytest.approx(2 / 3)
    assert out["eval/em/nq"] == 0.5 and out["eval/em/hotpotqa"] == 1.0
    assert out["eval/tool_calls_per_traj"] == 1.0 and out["eval/turns_mean"] == 2.0
    assert out["eval/f1/nq"] == 0.5 and out["eval/reward/hotpotqa"] == 1.0
    assert all(spec.temperature == 0.0 and not spec.logprobs for _, spec in engine.calls)
    assert [i["answer"] for i in out["items"]] == ["cedar"] * 3


async def test_sampling_several_answers_needs_sampling(toy_tokenizer):
    engine = ScriptedEngine(toy_tokenizer, [], repeat=[("<answer> cedar </answer>", "stop")])
    cfg = GeneratorsConfig(max_turns=1, max_tokens_per_turn=16, max_obs_tokens=16, max_response_tokens=32)
    with pytest.raises(ValueError, match="greedy"):
        await _answer(engine, [_prompt(0, "nq", "cedar")], toy_tokenizer, cfg, samples=2, max_model_len=128)
    out = await _answer(
        engine, [_prompt(0, "nq", "cedar")], toy_tokenizer, cfg, samples=3, greedy=False, max_model_len=128
    )
    assert out["eval/n"] == 3 and out["eval/pass@3/em"] == 1.0 and out["eval/samples"] == 3


async def test_a_baseline_answers_in_one_turn(toy_tokenizer):
    # max_turns=0: one turn that must answer; a search there ends the trajectory (the direct/RAG baselines)
    engine = ScriptedEngine(toy_tokenizer, [], repeat=[("<think> a </think> <search> x </search>", "stop")])
    cfg = GeneratorsConfig(max_turns=2, max_tokens_per_turn=32, max_obs_tokens=16, max_response_tokens=64)
    out = await _answer(
        engine, [_prompt(0, "nq", "cedar")], toy_tokenizer, cfg, max_turns=0, max_model_len=256
    )
    assert out["eval/turns_mean"] == 1.0 and out["eval/tool_calls_per_traj"] == 0.0
    assert out["eval/finish/max_turns"] == 1.0
