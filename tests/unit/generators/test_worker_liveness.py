"""Nothing in a worker dies silently: bad evaluation requests are answered with an error and counted, a dead
background loop fails the worker (its supervisor restarts it), and a failing retriever pauses sampling until it
answers again. Against a real Redis buffer with a scripted engine."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from buffer.redis_buffer import ReplayBuffer
from generators.settings import GeneratorsConfig
from generators.worker import GeneratorWorker
from tasks.search_r1 import SearchR1Task
from tests.fakes.engine import ScriptedEngine
from tests.timing import scaled
from tests.unit.generators.test_worker import ANSWER, SEARCH, _prompts, _take_all


def _worker(buffer, engine, tok, search, eval_prompts=None, **cfg_kw) -> GeneratorWorker:
    settings = dict(
        group_size=2,
        max_turns=2,
        max_tokens_per_turn=32,
        max_obs_tokens=32,
        max_response_tokens=128,
        max_inflight_groups=2,
        heartbeat_s=0.05,
        claim_block_ms=50,
    )
    return GeneratorWorker(
        GeneratorsConfig(**(settings | cfg_kw)),
        buffer,
        engine,
        tok,
        SearchR1Task(search=search),
        worker_id="gen-live",
        max_model_len=512,
        chat_template=False,
        eval_prompts=eval_prompts,
    )


async def _found(search: str) -> str:
    return f"Doc 1(Title: {search}) founded by cedar"


async def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + scaled(timeout_s)
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_bad_evaluation_requests_are_answered_with_an_error_and_the_loop_goes_on(
    redis_url, toy_tokenizer
):
    buffer = ReplayBuffer(redis_url, "live-eval")
    engine = ScriptedEngine(toy_tokenizer, [], repeat=[(ANSWER, "stop")])
    worker = _worker(buffer, engine, toy_tokenizer, _found, eval_prompts=lambda: _prompts(2))
    queue = buffer.key("eval", "requests")
    buffer._redis.rpush(queue, b"{not json")  # no id to answer to: counted and dropped
    bad_field = {"id": "e-bad#0", "eval_id": "e-bad", "shard": "first", "step": 1, "version": 0}
    future = {"id": "e-future#0", "eval_id": "e-future", "shard": [0, 1], "step": 9, "version": 9}
    good = {"id": "e-good#0", "eval_id": "e-good", "shard": [0, 1], "step": 0, "version": 0, "greedy": True}
    for request in (bad_field, future, good):
        buffer._redis.rpush(queue, json.dumps(request))
    for request in (bad_field, future, good):
        buffer._redis.set(buffer.key("eval", "shards", request["eval_id"]), 1)
    run = asyncio.create_task(worker.run())
    await _until(lambda: buffer.evaluation_answers("e-good") is not None)
    worker.request_stop()
    assert await asyncio.wait_for(run, scaled(10)) == 0
    assert worker.eval_errors == 3 and worker.metrics()["rollout/eval_errors"] == 3
    (bad,) = buffer.evaluation_answers("e-bad")
    assert bad["error"].startswith("ValueError") and bad["items"] == []
    (ahead,) = buffer.evaluation_answers("e-future")
    assert "asks for version 9, but the learner has published only 0" in ahead["error"]
    (answered,) = buffer.evaluation_answers("e-good")
    assert "error" not in answered and len(answered["items"]) == 2
    assert int(buffer._redis.get(buffer.key("eval", "malformed"))) == 1
    buffer.close()


def test_a_shard_answered_with_an_error_is_left_out_and_counted():
    from evaluation import EvaluationFailed, merge_answers

    failed = {"error": "ValueError: bad shard", "items": [], "eval/version": 3}
    ok = {"items": [], "eval/version": 3, "eval/seconds": 1.0}
    assert merge_answers([failed, ok])["eval/failed_shards"] == 1
    with pytest.raises(EvaluationFailed, match="bad shard"):
        merge_answers([failed, failed])


async def test_a_dead_background_loop_fails_the_worker(redis_url, toy_tokenizer, monkeypatch, caplog):
    buffer = ReplayBuffer(redis_url, "live-crash")
    engine = ScriptedEngine(toy_tokenizer, [], repeat=[(ANSWER, "stop")])
    worker = _worker(buffer, engine, toy_tokenizer, _found)

    async def broken_lease_loop():
        await asyncio.sleep(0.05)
        raise KeyError("lost track of a lease")

    monkeypatch.setattr(worker, "_lease_loop", broken_lease_loop)
    with pytest.raises(RuntimeError, match="background task 'leases' died: KeyError"):
        await asyncio.wait_for(worker.run(), scaled(10))
    assert "background task 'leases' died" in caplog.text and "Traceback" in caplog.text
    buffer.close()


async def test_a_failing_retriever_pauses_sampling_until_it_answers_again(redis_url, toy_tokenizer, caplog):
    caplog.set_level(logging.INFO, logger="generators")
    buffer = ReplayBuffer(redis_url, "live-tools", lease_s=30)
    buffer.release_prompts(_prompts(8))
    retriever = {"up": False, "calls": 0}

    async def search(query: str) -> str:
        retriever["calls"] += 1
        if not retriever["up"]:
            raise ConnectionError("retriever down")
        return await _found(query)

    engine = ScriptedEngine(toy_tokenizer, [], repeat=[(SEARCH, "stop"), (ANSWER, "stop")], delay_s=0.001)
    worker = _worker(
        buffer,
        engine,
        toy_tokenizer,
        search,
        max_inflight_groups=1,
        tool_pause={"min_calls": 2, "max_error_rate": 0.5, "probe_s": 0.1},
    )
    run = asyncio.create_task(worker.run())
    await _until(lambda: worker.tools.paused)
    await asyncio.sleep(0.3)  # paused: no new claims, only test calls
    metrics = worker.metrics()
    assert metrics["rollout/state"] == "paused" and "tool calls failed" in metrics["rollout/pause_reason"]
    assert metrics["rollout/tool_error_rate"] == 1.0 and metrics["rollout/tool_errors_total"] >= 2
    done_while_paused = worker.groups_done
    retriever["up"] = True
    await _until(lambda: not worker.tools.paused)
    taken = await _take_all(buffer, 8 - done_while_paused)
    worker.request_stop()
    assert await asyncio.wait_for(run, scaled(10)) == 0
    assert worker.tools.pauses == 1 and "sampling paused" in caplog.text and "sampling resumes" in caplog.text
    # every group put after the pause searched successfully
    assert all(t.info["tool_errors"] == 0 for g in taken[-4:] for t in g.group.trajectories)
    buffer.close()
