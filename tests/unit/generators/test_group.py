"""A whole group through the scripted engine: rewards, metadata and valid records that survive the codec."""

from __future__ import annotations

from buffer.codec import decode_group, encode_group
from buffer.records import PromptRecord
from generators.agent import AgentSettings
from generators.group import run_group
from tasks.search_r1 import SearchR1Task
from tasks.settings import SearchR1Config
from tests.fakes.engine import ScriptedEngine


def _settings(**kw) -> AgentSettings:
    base = dict(max_model_len=8192, temperature=1.0, top_p=1.0)
    return AgentSettings(**(base | kw))


def _prompt(index: int, content: str, answer: str, release_version: int = 0) -> PromptRecord:
    return PromptRecord(
        group_id=f"nq/train/{index}/e0",
        question=content,
        prompt=[{"role": "user", "content": content}],
        ground_truth=[answer],
        data_source="nq",
        index=index,
        release_version=release_version,
    )


async def test_group_of_scripted_samples_is_scored_and_valid(toy_tokenizer):
    tok = toy_tokenizer
    prompt = _prompt(5, "who founded alpha?", "Cedar", release_version=3)
    turns = [
        ("<think> a </think> <answer> cedar </answer>", "stop"),
        ("<think> b </think> <answer> birch </answer>", "stop"),
        ("<answer> the Cedar </answer>", "stop"),
    ]
    engine = ScriptedEngine(tok, turns)

    async def search(q: str) -> str:
        return "nothing"

    settings = _settings(max_turns=2, max_tokens_per_turn=32, max_obs_tokens=32, max_response_tokens=128)
    task = SearchR1Task(SearchR1Config(reward="format_em"), search=search)
    group, rollouts = await run_group(
        engine, prompt, task, tok, settings, n=3, chat_template=False, worker_id="w0"
    )
    group.validate()
    assert sorted(group.rewards.tolist()) == [0.2, 0.8, 1.0]
    assert group.release_version == 3 and group.worker_id == "w0" and group.group_id == "nq/train/5/e0"
    assert all(t.info["em"] in (0.0, 1.0) for t in group.trajectories)
    again = decode_group(encode_group(group))
    assert again.trajectories[0].response_ids.tolist() == group.trajectories[0].response_ids.tolist()


async def test_overlong_prompt_yields_an_empty_zero_reward_group(toy_tokenizer):
    tok = toy_tokenizer
    prompt = _prompt(1, "a b c d e f", "x")
    engine = ScriptedEngine(tok, [])
    settings = _settings(max_turns=1, max_tokens_per_turn=8, max_obs_tokens=8, max_response_tokens=16)
    group, _ = await run_group(
        engine, prompt, SearchR1Task(), tok, settings, n=2, chat_template=False, max_prompt_tokens=4
    )
    group.validate()
    assert engine.calls == [] and group.rewards.tolist() == [0.0, 0.0]
    assert group.trajectories[0].info["finish_reason"] == "prompt_too_long"


async def test_each_sample_is_reported_done_as_it_ends_not_when_the_group_does(toy_tokenizer):
    """The worker frees an engine slot per finished sample (its in-flight count), so the callback must fire when a
    sample ends: here two samples answer at once while the third still has a search and a second turn to go."""
    tok = toy_tokenizer
    prompt = _prompt(2, "who founded alpha?", "cedar")
    turns = [
        ("<answer> cedar </answer>", "stop"),
        ("<answer> birch </answer>", "stop"),
        ("<think> look </think> <search> alpha </search>", "stop"),
        ("<answer> cedar </answer>", "stop"),
    ]
    engine = ScriptedEngine(tok, turns, delay_s=0.01)

    async def search(q: str) -> str:
        return "Doc 1(Title: alpha) founded by cedar"

    calls_when_done: list[int] = []
    reported: list = []

    def done(rollout) -> None:
        calls_when_done.append(len(engine.calls))
        reported.append(rollout)

    settings = _settings(max_turns=2, max_tokens_per_turn=32, max_obs_tokens=32, max_response_tokens=128)
    _, rollouts = await run_group(
        engine,
        prompt,
        SearchR1Task(search=search),
        tok,
        settings,
        n=3,
        chat_template=False,
        on_rollout_done=done,
    )
    assert calls_when_done == [3, 3, 4]  # the two quick ones were reported before the slow one's second turn
    assert sorted(map(id, reported)) == sorted(map(id, rollouts))
