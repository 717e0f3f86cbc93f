"""Greedy evaluation with a scripted engine; the pool's GPU slicing and the CLI's argument checks."""

from __future__ import annotations

import pytest

from buffer.records import PromptRecord
from generators.evaluate import evaluate
from generators.settings import GeneratorsConfig
from generators.testing import ScriptedEngine


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
        engine, prompts, search, toy_tokenizer, cfg, max_model_len=512, chat_template=False, return_items=True,
        concurrency=1,
    )  # fmt: skip
    assert out["eval/n"] == 3
    assert out["eval/em"] == pytest.approx(2 / 3)
    assert out["eval/em/nq"] == 0.5 and out["eval/em/hotpotqa"] == 1.0
    assert out["eval/searches_per_traj"] == 1.0
    assert all(spec.temperature == 0.0 and not spec.logprobs for _, spec in engine.calls)
    assert [i["answer"] for i in out["items"]] == ["cedar"] * 3


def test_gpu_slices_split_visible_devices(monkeypatch):
    from generators.pool import _gpu_slices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert _gpu_slices(2, 2) == ["0,1", "2,3"]
    assert _gpu_slices(4, 1) == ["0", "1", "2", "3"]
    with pytest.raises(SystemExit, match="need 6 GPUs; 4 visible"):
        _gpu_slices(3, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _gpu_slices(2, 1) == [None, None]


def test_cli_needs_a_redis_url(capsys):
    from generators.cli import main

    assert main(["--config", "tiny"]) == 2
    assert "--redis-url" in capsys.readouterr().err


def test_worker_command_forwards_everything():
    from generators.pool import worker_command

    cmd = worker_command("tiny", "redis://x", "gen-3", 3, ["generators.group_size=2"])
    assert cmd[1:3] == ["-m", "generators.worker"]
    assert cmd[-5:] == ["--worker-id", "gen-3", "--engine-index", "3", "generators.group_size=2"]
