"""A worker never samples a prompt with weights older than the prompt's release: a prompt released at a version its
engine does not hold yet (the learner published it while the claim waited, after a weight push that missed this
engine) goes back to the buffer, and is generated once the engine holds that version."""

from __future__ import annotations

import asyncio

from buffer.redis_buffer import ReplayBuffer
from tests.fakes.engine import ScriptedEngine
from tests.timing import scaled
from tests.unit.generators.test_worker import ANSWER, _prompts, _take_all, _worker


class SyncedEngine(ScriptedEngine):
    """The scripted engine, as one that takes the learner's weights (its version is what it holds)."""

    has_weight_sync = True


async def test_a_prompt_released_ahead_of_the_engines_weights_waits_for_them(redis_url, toy_tokenizer):
    buffer = ReplayBuffer(redis_url, "behind", lease_s=30)
    buffer.publish_version(3)
    buffer.release_prompts(_prompts(2, release_version=3))
    engine = SyncedEngine(toy_tokenizer, [], repeat=[(ANSWER, "stop")], delay_s=0.001)
    engine.version = 3
    worker = _worker(buffer, engine, toy_tokenizer, claim_block_ms=3000)  # a claim that waits for new prompts

    async def no_weight_sync() -> None:  # the versions are set by the test, not by a learner
        return None

    worker._weight_sync_loop = no_weight_sync
    run = asyncio.create_task(worker.run())
    early = await _take_all(buffer, 2)
    await asyncio.sleep(0.5)  # the worker is in its next claim, waiting up to 3 s for new prompts
    # meanwhile the learner publishes version 4 (after a push that missed this engine) and releases prompts at it
    buffer.publish_version(4)
    buffer.release_prompts(_prompts(4, release_version=4)[2:])
    await asyncio.sleep(1.0)
    assert await _take_all(buffer, 2, timeout_s=1.0) == []  # not generated with version 3's weights
    assert (
        worker._held == {}
    )  # given back at once (they look expired: any engine holding version 4 takes them)

    engine.version = 4  # the weights arrive
    late = await _take_all(buffer, 2)
    worker.request_stop()
    assert await asyncio.wait_for(run, scaled(20)) == 0
    assert sorted(t.group.group_id for t in late) == ["nq/train/2/e0", "nq/train/3/e0"]
    for taken in early + late:
        sampled = taken.group.trajectories[0].sampled_versions()
        assert sampled.min() >= taken.group.release_version, taken.group.group_id
    buffer.close()
