"""A second task runs through the real agent loop, group runner and evaluation without touching any of them:
tests/fakes/arithmetic.py (a calculator tool) is all it takes."""

from __future__ import annotations

from generators.agent import AgentSettings, run_agent
from generators.evaluation import answer_shard
from generators.group import run_group
from generators.settings import GeneratorsConfig
from tests.fakes.arithmetic import ArithmeticTask, calculate
from tests.fakes.engine import ScriptedEngine

SETTINGS = AgentSettings(
    max_turns=3,
    max_tokens_per_turn=32,
    max_obs_tokens=16,
    max_response_tokens=200,
    max_model_len=512,
    temperature=1.0,
    top_p=1.0,
)


def test_the_calculator():
    assert calculate("17 * 23 - 1") == 390


async def test_a_tool_call_then_an_answer_through_the_agent_loop(toy_tokenizer):
    tok = toy_tokenizer
    task = ArithmeticTask()
    engine = ScriptedEngine(
        tok, [("think <calc> 17 * 23 </calc>", "stop"), ("so <final> 391 </final>", "stop")]
    )
    prompt = tok.encode(task.prompt_messages("What is 17 * 23?")[0]["content"])
    rollout = await run_agent(engine, prompt, task, tok, SETTINGS)
    assert (
        rollout.finish_reason == "answer" and rollout.tool_calls == 1 and rollout.tool_inputs == ["17 * 23"]
    )
    t1, obs, t2 = (
        tok.encode("think <calc> 17 * 23 </calc>"),
        tok.encode(" <result> 391 </result> "),
        tok.encode("so <final> 391 </final>"),
    )
    assert rollout.response_ids == t1 + obs + t2
    assert rollout.loss_mask == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
    assert engine.calls[0][1].stop == ("</calc>", "</final>")  # the task's stop strings reach the engine
    assert task.score(rollout, ["391"]).reward == 1.0


async def test_a_group_and_an_evaluation_of_the_second_task(toy_tokenizer, tmp_path):
    tok = toy_tokenizer
    task = ArithmeticTask()
    (tmp_path / "q.txt").write_text("2 + 2=4\n3 * 3=9\n")
    prompts = task.load_prompts(tmp_path / "q.txt", split="test")
    script = [
        ("<calc> 2 + 2 </calc>", "stop"),
        ("<final> 4 </final>", "stop"),
        ("<final> 5 </final>", "stop"),
    ]
    group, _ = await run_group(
        ScriptedEngine(tok, script), prompts[0], task, tok, SETTINGS, n=2, chat_template=False
    )
    group.validate()
    assert sorted(group.rewards.tolist()) == [0.0, 1.0] and group.data_source == "arith"
    engine = ScriptedEngine(tok, [], repeat=[("<final> 9 </final>", "stop")])
    cfg = GeneratorsConfig(max_turns=2, max_tokens_per_turn=32, max_obs_tokens=16, max_response_tokens=128)
    out = await answer_shard(engine, prompts, task, tok, cfg, max_model_len=512, chat_template=False)
    assert out["eval/correct"] == 0.5 and out["eval/correct/arith"] == 0.5 and out["eval/n"] == 2
