"""The agent loop against a scripted engine: exact token arrays for every way a trajectory can go."""

from __future__ import annotations

import numpy as np
import pytest

from generators.agent import AgentSettings, observation_ids, run_agent
from retrieval.client import SearchResult
from tasks import Observation
from tasks.search_r1 import SearchR1Task
from tasks.search_r1.protocol import INFORMATION_CLOSE, INFORMATION_OPEN, INVALID_ACTION, information_block
from tests.fakes.engine import ScriptedEngine

SEARCH_1 = "<think> need the founder </think> <search> founder of alpha </search>"
SEARCH_2 = "<think> and the year </think> <search> alpha year </search>"
ANSWER = "<think> got it </think> <answer> Cedar </answer>"


def _docs(query: str) -> SearchResult:
    return SearchResult(
        query=query,
        documents=[
            {"id": "1", "contents": f'"Alpha"\n{query} was cedar'},
            {"id": "2", "contents": '"B"\nbee'},
        ],
        scores=[2.0, 1.0],
    )


async def _search(query: str) -> SearchResult:
    return _docs(query)


def _obs(tok, query: str) -> list[int]:
    text = f'Doc 1(Title: "Alpha") {query} was cedar\nDoc 2(Title: "B") bee'
    return tok.encode(f"{INFORMATION_OPEN}{text}{INFORMATION_CLOSE}")


def _settings(**kw) -> AgentSettings:
    base = dict(
        max_turns=4,
        max_tokens_per_turn=64,
        max_obs_tokens=200,
        max_response_tokens=1000,
        max_model_len=4096,
        temperature=1.0,
        top_p=1.0,
    )
    return AgentSettings(**(base | kw))


def _task(search=_search) -> SearchR1Task:
    return SearchR1Task(search=search)


def _answer(rollout):
    return _task().score(rollout, []).metrics["answer"]


def _well_formed(rollout) -> bool:
    return _task().score(rollout, []).metrics["well_formed"]


async def test_two_searches_then_answer_exact_arrays(toy_tokenizer):
    tok = toy_tokenizer
    prompt = tok.encode("Question: who founded alpha?\n")
    engine = ScriptedEngine(tok, [(SEARCH_1, "stop"), (SEARCH_2, "stop"), (ANSWER, "stop")])
    # a weight update lands before the third turn: its tokens carry version 1
    engine.on_call = lambda e, call: setattr(e, "version", 1) if call == 2 else None
    rollout = await run_agent(engine, prompt, _task(_search), tok, _settings())

    t1, t2, t3 = tok.encode(SEARCH_1), tok.encode(SEARCH_2), tok.encode(ANSWER)
    o1, o2 = _obs(tok, "founder of alpha"), _obs(tok, "alpha year")
    assert rollout.response_ids == t1 + o1 + t2 + o2 + t3
    assert rollout.loss_mask == [1] * len(t1) + [0] * len(o1) + [1] * len(t2) + [0] * len(o2) + [1] * len(t3)
    n_sampled = len(t1) + len(t2) + len(t3)
    expected_lp = [-(k + 1) / 100 for k in range(n_sampled)]
    got_lp = [lp for lp, m in zip(rollout.behavior_logprobs, rollout.loss_mask, strict=True) if m]
    assert got_lp == expected_lp
    assert all(lp == 0.0 for lp, m in zip(rollout.behavior_logprobs, rollout.loss_mask, strict=True) if not m)
    assert rollout.versions == (
        [0] * len(t1) + [-1] * len(o1) + [0] * len(t2) + [-1] * len(o2) + [1] * len(t3)
    )
    # every turn saw the whole context so far, as token ids (never re-encoded text)
    assert [c[0] for c in engine.calls] == [prompt, prompt + t1 + o1, prompt + t1 + o1 + t2 + o2]
    assert rollout.finish_reason == "answer" and _answer(rollout) == "Cedar"
    assert (rollout.tool_calls, rollout.turns, rollout.invalid_actions) == (2, 3, 0)
    assert rollout.tool_inputs == ["founder of alpha", "alpha year"]
    assert _well_formed(rollout)

    traj = rollout.to_trajectory(1.0)
    traj.validate()
    assert traj.response_ids.dtype == np.int32 and traj.loss_mask.dtype == np.uint8
    assert traj.info["tool_calls"] == 2 and traj.info["finish_reason"] == "answer"


async def test_invalid_action_gets_search_r1_message_and_goes_on(toy_tokenizer):
    tok = toy_tokenizer
    rambling = "<think> hmm </think> " + "maybe cedar " * 10
    engine = ScriptedEngine(tok, [(rambling, "stop"), (ANSWER, "stop")])
    rollout = await run_agent(
        engine, tok.encode("Q?"), _task(_search), tok, _settings(max_tokens_per_turn=20)
    )
    t1 = tok.encode(rambling)[:20]  # cut by the per-turn limit: neither a search nor an answer
    invalid = tok.encode(INVALID_ACTION)
    assert rollout.response_ids[: len(t1) + len(invalid)] == t1 + invalid
    assert rollout.loss_mask[len(t1) : len(t1) + len(invalid)] == [0] * len(invalid)
    assert rollout.invalid_actions == 1 and rollout.tool_calls == 0
    assert rollout.finish_reason == "answer"
    assert not _well_formed(rollout)  # an invalid action makes the trajectory malformed for format_em
    assert "My previous action is invalid." in INVALID_ACTION


@pytest.mark.parametrize("mode", ["error_result", "raises"])
async def test_retrieval_failure_is_an_explicit_observation(toy_tokenizer, mode):
    tok = toy_tokenizer

    async def failing(query: str):
        if mode == "raises":
            raise ConnectionError("refused")
        return SearchResult(query=query, error="cannot reach the retrieval server")

    engine = ScriptedEngine(tok, [(SEARCH_1, "stop"), (ANSWER, "stop")])
    rollout = await run_agent(engine, tok.encode("Q?"), _task(failing), tok, _settings())
    t1 = tok.encode(SEARCH_1)
    obs = tok.decode(rollout.response_ids[len(t1) : len(rollout.response_ids) - len(tok.encode(ANSWER))])
    assert obs.startswith(INFORMATION_OPEN) and obs.endswith(INFORMATION_CLOSE)
    assert "Search unavailable" in obs
    assert rollout.tool_errors == 1 and rollout.finish_reason == "answer"


async def test_max_turns_stops_after_the_final_turn_without_searching(toy_tokenizer):
    tok = toy_tokenizer
    searched: list[str] = []

    async def search(q: str) -> str:
        searched.append(q)
        return "Doc 1(Title: x) y"

    engine = ScriptedEngine(tok, [(SEARCH_1, "stop")] * 3)
    rollout = await run_agent(engine, tok.encode("Q?"), _task(search), tok, _settings(max_turns=2))
    assert rollout.finish_reason == "max_turns"
    assert rollout.turns == 3 and rollout.tool_calls == 2 and len(searched) == 2
    # the last turn's tokens are the end of the response: no observation after it
    t = tok.encode(SEARCH_1)
    assert rollout.response_ids[-len(t) :] == t and rollout.loss_mask[-len(t) :] == [1] * len(t)
    assert _answer(rollout) is None


async def test_long_observation_is_cut_keeping_the_closing_tag(toy_tokenizer):
    tok = toy_tokenizer

    async def search(q: str) -> str:
        return "Doc 1(Title: long) " + " ".join(f"w{i}" for i in range(200))

    engine = ScriptedEngine(tok, [(SEARCH_1, "stop"), (ANSWER, "stop")])
    rollout = await run_agent(engine, tok.encode("Q?"), _task(search), tok, _settings(max_obs_tokens=20))
    t1, t2 = tok.encode(SEARCH_1), tok.encode(ANSWER)
    obs = rollout.response_ids[len(t1) : -len(t2)]
    close = tok.encode(INFORMATION_CLOSE)
    assert len(obs) == 20 and obs[-len(close) :] == close
    assert obs[: len(tok.encode(INFORMATION_OPEN))] == tok.encode(INFORMATION_OPEN)
    assert rollout.truncated_observations == 1
    ids, cut = observation_ids(Observation(information_block("short"), keep_tail=INFORMATION_CLOSE), tok, 20)
    assert not cut and tok.decode(ids) == f"{INFORMATION_OPEN}short{INFORMATION_CLOSE}"


async def test_token_budget_limits_the_turn_and_stops_the_trajectory(toy_tokenizer):
    tok = toy_tokenizer
    t1 = tok.encode(SEARCH_1)
    budget = len(t1) + 30  # room for the first turn and part of the observation, not for a second turn
    engine = ScriptedEngine(tok, [(SEARCH_1, "stop"), (ANSWER, "stop")])
    rollout = await run_agent(
        engine,
        tok.encode("Q?"),
        _task(_search),
        tok,
        _settings(max_response_tokens=budget, max_obs_tokens=100),
    )
    assert rollout.finish_reason == "budget"
    assert len(rollout.response_ids) <= budget
    assert rollout.response_ids == t1  # the observation did not fit with room to sample after it
    assert len(engine.calls) == 1 and engine.calls[0][1].max_tokens == min(64, budget)

    # a turn cut by the budget (not by the per-turn limit) ends the trajectory too
    engine = ScriptedEngine(tok, [(SEARCH_1, "stop")])
    rollout = await run_agent(engine, tok.encode("Q?"), _task(_search), tok, _settings(max_response_tokens=5))
    assert rollout.finish_reason == "budget" and len(rollout.response_ids) == 5
    assert engine.calls[0][1].max_tokens == 5


async def test_model_length_bounds_the_budget(toy_tokenizer):
    tok = toy_tokenizer
    prompt = tok.encode("Q?")
    engine = ScriptedEngine(tok, [(SEARCH_1, "stop")])
    await run_agent(engine, prompt, _task(_search), tok, _settings(max_model_len=len(prompt) + 7))
    assert engine.calls[0][1].max_tokens == 7


async def test_eos_without_answer_ends_the_trajectory(toy_tokenizer):
    tok = toy_tokenizer
    engine = ScriptedEngine(tok, [("<think> no idea </think>", "eos")])
    rollout = await run_agent(engine, tok.encode("Q?"), _task(_search), tok, _settings())
    assert rollout.finish_reason == "eos" and rollout.turns == 1
    assert rollout.response_ids[-1] == tok.eos_token_id and rollout.loss_mask[-1] == 1


async def test_greedy_asks_for_temperature_zero(toy_tokenizer):
    tok = toy_tokenizer
    engine = ScriptedEngine(tok, [(ANSWER, "stop")])
    await run_agent(engine, tok.encode("Q?"), _task(_search), tok, _settings(temperature=0.7), greedy=True)
    spec = engine.calls[0][1]
    assert spec.temperature == 0.0 and spec.stop == ("</search>", "</answer>")
