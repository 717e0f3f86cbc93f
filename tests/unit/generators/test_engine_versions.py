"""Whole trajectories through the engine wrapper and vLLM's real front end (AsyncLLM over the scripted engine core of
fakes/null_engine.py, Qwen2.5's tokenizer), with weight updates landing between two engine steps mid-turn: the
token ids, log-probs, versions and loss masks are exactly what the engine core emitted, step by step. Both ways the
wrapper reads versions give the same arrays: vLLM's weight-version labels with one output per call, and per-step
streaming (the way for a vLLM without labels, and what the wrapper did before the labels)."""

from __future__ import annotations

import asyncio

import pytest

from generators.agent import AgentSettings, run_agent
from generators.settings import EngineConfig
from retrieval.client import SearchResult
from tasks.search_r1 import SearchR1Task, protocol

SETTINGS = AgentSettings(
    max_turns=2,
    max_tokens_per_turn=40,
    max_obs_tokens=64,
    max_response_tokens=400,
    max_model_len=2048,
    temperature=1.0,
    top_p=1.0,
)
EOS = "<|im_end|>"
# each trajectory's turns; text after a stop string is never sampled (the detokenizer ends the turn at the string)
SCRIPTS = [
    [
        "<think> the founder of alpha is what I need </think> <search> founder of alpha </search> and more",
        "<think> it says cedar </think> <answer> Cedar </answer>",
    ],
    [
        "<think> first </think> <search> alpha </search>",
        "<think> second </think> <search> alpha founder year </search>",
        "<think> done </think> <answer> Cedar </answer>",
    ],
    [
        "<think> " + "a long thought that goes on " * 8 + "</think>",  # cut by max_tokens_per_turn: invalid
        "<think> now </think> <answer> Cedar </answer>",
    ],
    ["<think> I give up </think>" + EOS + " never sampled"],
]
HOLDS = (5, 40)  # engine steps before which a weight update lands


def _docs(query: str) -> SearchResult:
    return SearchResult(query, [{"id": "1", "contents": f'"Alpha"\n{query} was founded by cedar'}], [1.0])


async def _search(query: str) -> SearchResult:
    return _docs(query)


class Turns:
    """The engine core's model: each request gets the next turn of the trajectory its prompt starts with, and every
    token a log-prob of its own, exact in float32."""

    def __init__(self, tokenizer, prompts: list[list[int]]):
        self.scripts = [[tokenizer.encode(t, add_special_tokens=False) for t in turns] for turns in SCRIPTS]
        self.prompts = prompts
        self.calls = [0] * len(prompts)
        self.emitted = 0

    def __call__(self, request) -> tuple[list[int], list[float]]:
        (i,) = [i for i, p in enumerate(self.prompts) if request.prompt_token_ids[: len(p)] == p]
        ids = self.scripts[i][self.calls[i]]
        self.calls[i] += 1
        logprobs = [-(self.emitted + k + 1) / 256 for k in range(len(ids))]
        self.emitted += len(ids)
        return ids, logprobs


def _expected(rollout, history, holds: list[int], tokenizer) -> dict[str, list]:
    """The arrays from what the core emitted: for each turn, the request whose prompt is the context so far."""
    by_prompt = {tuple(r.prompt_token_ids): r for r in history}
    out: dict[str, list] = {"ids": [], "mask": [], "logprobs": [], "versions": []}
    context = list(rollout.prompt_ids)
    turn = 0
    while tuple(context) in by_prompt:
        req = by_prompt[tuple(context)]
        ids = req.token_ids[: req.emitted]
        assert len(ids) == req.emitted, "a script ran out: the core sampled EOS it was not given"
        steps = range(req.first_step, req.first_step + req.emitted)
        out["ids"] += ids
        out["mask"] += [1] * len(ids)
        out["logprobs"] += req.logprobs[: req.emitted]
        out["versions"] += [sum(k <= s for k in holds) for s in steps]
        context += ids
        # the observation the agent appends after this turn, if any
        text = tokenizer.decode(ids, skip_special_tokens=True)
        kind, query = protocol.parse_action(text)
        if turn == len(rollout.turn_texts) - 1:
            break
        obs_text = (
            protocol.information_block(protocol.format_documents(_docs(query).documents))
            if kind == "search"
            else protocol.INVALID_ACTION
        )
        obs = tokenizer.encode(obs_text, add_special_tokens=False)
        out["ids"] += obs
        out["mask"] += [0] * len(obs)
        out["logprobs"] += [0.0] * len(obs)
        out["versions"] += [-1] * len(obs)
        context += obs
        turn += 1
    return out


async def _trajectories(engine, tokenizer, *, labelled: bool):
    """Run the four scripted trajectories at once; a weight update lands at each of HOLDS."""
    core = engine.llm.engine_core
    core.history = []
    engine.labels_versions = labelled
    prompts = [tokenizer.encode(f"Question {i}: who founded alpha?\n") for i in range(len(SCRIPTS))]
    turns = core.turns = Turns(tokenizer, prompts)
    task = SearchR1Task(search=_search)
    agents = asyncio.gather(*(run_agent(engine, p, task, tokenizer, SETTINGS) for p in prompts))
    applied = []
    start = core.stats.steps  # the holds count from this run's first step
    for step in HOLDS:
        held = asyncio.ensure_future(core.hold_at(start + step).wait())
        await asyncio.wait([held, agents], return_when=asyncio.FIRST_COMPLETED)
        if not held.done():
            held.cancel()
            break
        await engine.apply_update({"version": engine.version + 1})
        applied.append(start + step)
        core.release()
    rollouts = await agents
    assert turns.calls == [len(s) for s in SCRIPTS]
    return rollouts, list(core.history), applied, start


@pytest.fixture
async def engine(qwen_tokenizer_dir, tmp_path):
    from fakes.null_engine import null_vllm_engine, write_null_model

    model_dir = write_null_model(tmp_path / "null-model", qwen_tokenizer_dir)
    engine = null_vllm_engine(
        str(model_dir), EngineConfig(max_num_seqs=16), turns=None, max_model_len=2048, weight_sync=False
    )
    yield engine
    engine.shutdown()


async def test_versions_log_probs_and_masks_are_the_engine_steps_across_mid_turn_updates(engine):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(engine.llm.model_config.tokenizer)
    assert engine.labels_versions, "vLLM 0.32 labels output tokens with the weights' version"
    results = {}
    for labelled in (True, False):
        engine.version = engine.initial_version = 0
        await engine.llm.update_weight_version("0")
        rollouts, history, applied, start = await _trajectories(engine, tokenizer, labelled=labelled)
        assert applied == [start + k for k in HOLDS], "both updates should land while the trajectories run"
        for rollout in rollouts:
            want = _expected(rollout, history, applied, tokenizer)
            assert rollout.response_ids == want["ids"]
            assert rollout.loss_mask == want["mask"]
            assert rollout.behavior_logprobs == want["logprobs"]
            assert rollout.versions == want["versions"]
        across = [r for r in history if r.first_step < applied[0] < r.first_step + r.emitted]
        assert across, "an update should land in the middle of a turn"
        assert [r.finish_reason for r in rollouts] == ["answer", "answer", "answer", "eos"]
        assert rollouts[2].invalid_actions == 1 and rollouts[1].tool_calls == 2
        results[labelled] = [
            (r.response_ids, r.loss_mask, r.behavior_logprobs, r.versions, r.turn_texts) for r in rollouts
        ]
    assert results[True] == results[False]


def test_labels_that_do_not_cover_the_tokens_are_an_error():
    from types import SimpleNamespace

    from generators.engine import VLLMEngine

    engine = VLLMEngine(SimpleNamespace())
    with pytest.raises(RuntimeError, match="spans cover 2 of 3 tokens"):
        engine._labelled_versions([type("Span", (), {"version": "1", "start": 0, "end": 2})()], 3)
    with pytest.raises(RuntimeError, match="3 tokens without a weight-version label"):
        engine._labelled_versions(None, 3)
    assert engine._labelled_versions(None, 0) == []


async def test_an_update_cancelled_while_pausing_leaves_the_engine_running(engine):
    """A weight-sync task cancelled in the middle of the pause (the engine already paused) still resumes it."""
    core = engine.llm.engine_core
    update = asyncio.create_task(engine.apply_update({"version": 1}))
    while not await core.is_scheduler_paused_async():
        await asyncio.sleep(0)
    update.cancel()  # AsyncLLM.pause_generation is in its short sleep after the engine paused
    with pytest.raises(asyncio.CancelledError):
        await update
    assert not await core.is_scheduler_paused_async() and engine.version == 0


async def test_vllms_own_statistics_are_off_unless_asked_for(engine, qwen_tokenizer_dir, tmp_path):
    """`generators.engine.log_stats` (off by default) reaches AsyncLLM: no per-step stats bookkeeping in the front end
    nor stat loggers, unless the config asks for them."""
    from fakes.null_engine import null_vllm_engine, write_null_model

    assert engine.llm.log_stats is False and engine.llm.logger_manager is None
    model_dir = write_null_model(tmp_path / "logged", qwen_tokenizer_dir)
    logged = null_vllm_engine(
        str(model_dir), EngineConfig(max_num_seqs=4, log_stats=True), turns=None, weight_sync=False
    )
    try:
        assert logged.llm.log_stats is True and logged.llm.logger_manager is not None
    finally:
        logged.shutdown()
