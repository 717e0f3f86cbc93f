"""A worker cut from Redis for longer than `buffer.reconnect_s` (a black hole through fakes/fault_proxy.py):
it keeps the groups it holds, goes on claiming and putting once Redis answers again, and every prompt ends up put
exactly once; before, its claim loop raised past reconnect_s and the process died with what it held."""

from __future__ import annotations

import asyncio

import pytest

from buffer.redis_buffer import ReplayBuffer
from fakes.fault_proxy import FaultProxy
from tests.fakes.engine import ScriptedEngine
from tests.timing import scaled
from tests.unit.generators.test_worker import ANSWER, SEARCH, _prompts, _take_all, _worker


@pytest.mark.timeout(60)
async def test_a_worker_cut_from_redis_past_reconnect_s_rides_it_out(redis_server, redis_url, toy_tokenizer):
    direct = ReplayBuffer(redis_url, "cut", lease_s=30)
    direct.release_prompts(_prompts(4))
    with FaultProxy(("127.0.0.1", redis_server.port)) as proxy:
        cut = ReplayBuffer(proxy.url(), "cut", lease_s=30, reconnect_s=0.5, socket_timeout_s=0.3)
        engine = ScriptedEngine(toy_tokenizer, [], repeat=[(SEARCH, "stop"), (ANSWER, "stop")], delay_s=0.05)
        worker = _worker(cut, engine, toy_tokenizer, worker_id="gen-cut")
        run = asyncio.create_task(worker.run())
        deadline = asyncio.get_running_loop().time() + scaled(10)
        while len(worker._held) < 2:  # two groups claimed and running before the cut
            assert asyncio.get_running_loop().time() < deadline, "the worker never claimed its groups"
            await asyncio.sleep(0.02)
        proxy.blackhole()
        await asyncio.sleep(
            2.5
        )  # past reconnect_s several times over: claims and puts fail and are tried again
        assert not run.done() and worker._held  # alive, and it kept the groups it holds
        proxy.restore()
        taken = await _take_all(direct, 4)
        worker.request_stop()
        assert await asyncio.wait_for(run, scaled(20)) == 0
    assert sorted(t.group.group_id for t in taken) == [f"nq/train/{i}/e0" for i in range(4)]
    stats = direct.stats()
    assert stats["buffer/produced"] == 4 and stats["buffer/inflight_groups"] == 4
    assert cut.reconnects.count >= 1
    cut.close()
    direct.close()
