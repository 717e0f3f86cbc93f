"""The worker against a real Redis buffer with a scripted engine: groups flow, heartbeats report, SIGTERM drains."""

from __future__ import annotations

import asyncio

from buffer.records import PromptRecord
from buffer.redis_buffer import ReplayBuffer
from generators.settings import GeneratorsConfig
from generators.worker import GeneratorWorker
from tasks.search_r1 import SearchR1Task
from tests.fakes.engine import ScriptedEngine
from tests.timing import scaled

SEARCH = "<think> look </think> <search> alpha </search>"
ANSWER = "<think> ok </think> <answer> cedar </answer>"


def _prompts(n: int, release_version: int = 0) -> list[PromptRecord]:
    return [
        PromptRecord(
            group_id=f"nq/train/{i}/e0",
            question=f"q{i}",
            prompt=[{"role": "user", "content": f"who founded alpha {i}?"}],
            ground_truth=["cedar"],
            data_source="nq",
            index=i,
            release_version=release_version,
        )
        for i in range(n)
    ]


def _worker(buffer, engine, tok, worker_id: str = "gen-test", **cfg_kw) -> GeneratorWorker:
    cfg = GeneratorsConfig(
        **(
            dict(
                group_size=3,
                max_turns=2,
                max_tokens_per_turn=32,
                max_obs_tokens=32,
                max_response_tokens=128,
                max_inflight_groups=2,
                heartbeat_s=0.05,
                claim_block_ms=50,
            )
            | cfg_kw
        )
    )

    async def search(q: str) -> str:
        return f"Doc 1(Title: {q}) founded by cedar"

    return GeneratorWorker(
        cfg,
        buffer,
        engine,
        tok,
        SearchR1Task(search=search),
        worker_id=worker_id,
        max_model_len=512,
        chat_template=False,
    )


async def _take_all(buffer: ReplayBuffer, n: int, timeout_s: float = 20.0) -> list:
    got = []
    deadline = asyncio.get_running_loop().time() + scaled(timeout_s)
    while len(got) < n and asyncio.get_running_loop().time() < deadline:
        got += await asyncio.to_thread(buffer.take, n - len(got), "learner-test", 100)
    return got


async def test_worker_streams_groups_and_heartbeats(redis_url, toy_tokenizer):
    buffer = ReplayBuffer(redis_url, "t", lease_s=30)
    buffer.release_prompts(_prompts(5, release_version=2))
    engine = ScriptedEngine(toy_tokenizer, [], repeat=[(SEARCH, "stop"), (ANSWER, "stop")], delay_s=0.001)
    worker = _worker(buffer, engine, toy_tokenizer)
    run = asyncio.create_task(worker.run())
    taken = await _take_all(buffer, 5)
    await asyncio.sleep(0.2)  # a heartbeat after the last group
    beat = next(w for w in buffer.workers() if w["worker_id"] == "gen-test")
    worker.request_stop()
    assert await asyncio.wait_for(run, scaled(10)) == 0

    assert sorted(t.group.group_id for t in taken) == [f"nq/train/{i}/e0" for i in range(5)]
    for t in taken:
        t.group.validate()
        assert len(t.group.trajectories) == 3 and t.group.release_version == 2
        assert t.group.worker_id == "gen-test"
    metrics = beat["metrics"]
    assert beat["role"] == "generator"
    assert metrics["rollout/groups_done"] == 5 and metrics["rollout/trajectories_done"] == 15
    assert metrics["rollout/tool_calls_total"] >= 1 and metrics["rollout/tokens_total"] > 0
    assert sum(v for k, v in metrics.items() if k.startswith("rollout/finish/")) == 15
    assert metrics["rollout/inflight_trajectories"] == 0
    assert buffer.inflight()  # the buffer's own view is readable (no crash); the prompts are finished
    buffer.close()


async def test_stop_releases_unfinished_prompts_to_other_workers(redis_url, toy_tokenizer):
    buffer = ReplayBuffer(redis_url, "t", lease_s=30)
    buffer.release_prompts(_prompts(4))
    # a slow engine: nothing finishes before the drain deadline
    engine = ScriptedEngine(toy_tokenizer, [], repeat=[(SEARCH, "stop")], delay_s=0.5)
    worker = _worker(buffer, engine, toy_tokenizer, drain_timeout_s=0.1, max_inflight_groups=2)
    run = asyncio.create_task(worker.run())
    while len(worker._held) < 2:
        await asyncio.sleep(0.01)
    worker.request_stop()
    assert await asyncio.wait_for(run, scaled(10)) == 0
    assert worker._held == {} and worker.inflight_trajectories == 0
    # another worker claims the two released prompts at once, and the two never claimed
    other = buffer.claim_prompts("gen-other", 10)
    assert sorted(c.prompt.index for c in other) == [0, 1, 2, 3]
    buffer.close()


async def test_a_release_goes_round_the_waiting_workers(redis_url, toy_tokenizer):
    """Eight prompts released at once while two workers with eight free slots each wait in their claim: each read
    takes at most claim_batch_groups, so both get work (one read of eight would leave the other idle)."""
    buffer = ReplayBuffer(redis_url, "t", lease_s=30)
    slow = [(SEARCH, "stop")]
    workers = [
        _worker(
            buffer,
            ScriptedEngine(toy_tokenizer, [], repeat=slow, delay_s=2.0),
            toy_tokenizer,
            worker_id=f"gen-{i}",
            max_inflight_groups=8,
            claim_batch_groups=2,
            claim_block_ms=1000,
            drain_timeout_s=0.1,
        )
        for i in range(2)
    ]
    runs = [asyncio.create_task(w.run()) for w in workers]
    # both in their claim loops: blocked in a read but for a moment between reads
    await asyncio.sleep(scaled(1.5))
    buffer.release_prompts(_prompts(8))
    while sum(len(w._held) for w in workers) < 8:
        await asyncio.sleep(0.01)
    held = sorted(len(w._held) for w in workers)
    for worker in workers:
        worker.request_stop()
    # a stopping worker first finishes the blocking read it is in (up to claim_block_ms, in a thread of the default
    # executor, which both workers' Redis calls share): a generous bound, not a timing
    assert await asyncio.wait_for(asyncio.gather(*runs), scaled(60)) == [0, 0]
    assert held[0] >= 2, f"one worker took {held[1]} of 8 groups, the other {held[0]}"
    buffer.close()


async def test_failed_group_releases_its_prompt(redis_url, toy_tokenizer):
    buffer = ReplayBuffer(redis_url, "t", lease_s=30)
    buffer.release_prompts(_prompts(1))
    engine = ScriptedEngine(toy_tokenizer, [])  # raises: ran out of turns
    worker = _worker(buffer, engine, toy_tokenizer, max_inflight_groups=1)
    run = asyncio.create_task(worker.run())
    while worker.groups_failed == 0:
        await asyncio.sleep(0.01)
    worker.request_stop()
    assert await asyncio.wait_for(run, scaled(10)) == 0
    assert worker.groups_failed >= 1
