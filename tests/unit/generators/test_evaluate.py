"""Greedy evaluation with a scripted engine."""

from __future__ import annotations

import pytest

from buffer.records import PromptRecord
from generators.evaluate import evaluate
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
