"""The worker extension's tensor-parallel path without vLLM: fake engines whose workers are the real
`WeightSyncExtension`, joined through the real `EngineWeightSync` and fed by a real `WeightPublisher` over gloo.

Each fake worker stands in for one vLLM worker of a tensor-parallel engine: it receives the full weights and keeps its
own row slice of every tensor, as vLLM's column-parallel weight loaders do. The tests check the rank arithmetic (one
rank per worker, world size 1 + all workers), that every worker loads its shard of exactly what was sent, and that an
engine claiming after the group closed is told so and is taken into the next epoch; engines the extension does not
serve (pipeline or data parallel) are refused before they claim a rank.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from fakes.weight_sync import receive_and_ack
from tests.timing import scaled
from weight_sync.engine_side import EngineWeightSync
from weight_sync.process_group import WeightSyncError
from weight_sync.publisher import WeightPublisher
from weight_sync.rendezvous import Rendezvous
from weight_sync.settings import WeightSyncConfig
from weight_sync.vllm_extension import WeightSyncExtension

NS = "wstp"


class _FakeWorker(WeightSyncExtension):
    """One worker of a tensor-parallel engine: the real extension, with vLLM's worker attributes it reads."""

    def __init__(self, index: int, workers: int):
        self.rank = index
        self.workers = workers
        self.vllm_config = SimpleNamespace(
            parallel_config=SimpleNamespace(
                data_parallel_size=1, pipeline_parallel_size=1, world_size=workers
            )
        )
        self.loaded: dict[str, torch.Tensor] = {}

    def reload_weights(self, weights_iterator, is_checkpoint_format: bool) -> None:
        # like a column-parallel loader: the full tensor arrives, the worker keeps its slice of dim 0
        assert is_checkpoint_format
        for name, full in weights_iterator:
            rows = full.shape[0] // self.workers
            self.loaded[name] = full.narrow(0, self.rank * rows, rows).clone()


class _FakeEngine:
    """Stands in for AsyncLLM: `collective_rpc` calls the method on every worker at once (as vLLM's executor does;
    a broadcast completes only when every member takes part)."""

    def __init__(self, workers: int):
        self.workers = [_FakeWorker(i, workers) for i in range(workers)]

    async def collective_rpc(self, method: str, args: tuple = ()):
        return list(
            await asyncio.gather(*(asyncio.to_thread(getattr(w, method), *args) for w in self.workers))
        )

    async def pause_generation(self, **_) -> None:
        pass

    async def resume_generation(self) -> None:
        pass

    def close(self) -> None:
        for worker in self.workers:
            worker.ws_leave()


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=g),
        "model.layers.0.self_attn.qkv_proj.weight": torch.randn(48, 16, generator=g),
        "model.layers.0.self_attn.qkv_proj.bias": torch.randn(48, generator=g),
        "lm_head.weight": torch.randn(64, 16, generator=g),
    }


async def _wait_for(predicate, timeout_s: float = 30.0):
    deadline = asyncio.get_running_loop().time() + scaled(timeout_s)
    while not (value := predicate()):
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
    return value


async def _join(sync: EngineWeightSync, engine: _FakeEngine, epoch: int) -> None:
    await _wait_for(lambda: (sync.rendezvous.read() or {}).get("epoch") == epoch)
    assert await sync.ensure_joined(engine)


async def _apply(sync: EngineWeightSync, engine: _FakeEngine, version: int) -> int:
    update = await _wait_for(lambda: sync.pending_update(version))
    return await receive_and_ack(engine, sync, update)


def _assert_shards(engine: _FakeEngine, sent: dict[str, torch.Tensor]) -> None:
    for worker in engine.workers:
        assert set(worker.loaded) == set(sent)
        for name, full in sent.items():
            rows = full.shape[0] // len(engine.workers)
            assert torch.equal(worker.loaded[name], full[worker.rank * rows : (worker.rank + 1) * rows]), name


def _group_ranks(engine: _FakeEngine) -> list[int]:
    return [worker._ws_joiner.result().rank for worker in engine.workers]


async def test_every_worker_of_a_tensor_parallel_engine_joins_and_loads_its_shard(redis_url):
    with Rendezvous(redis_url, NS) as learner_rv, Rendezvous(redis_url, NS) as engine_rv:
        pub = WeightPublisher(learner_rv, WeightSyncConfig(backend="gloo", bucket_mb=0.004, timeout_s=30), 2)
        engines = {"tp2": _FakeEngine(2), "tp1": _FakeEngine(1)}
        syncs = {name: EngineWeightSync(engine_rv, name) for name in engines}
        try:
            connect = asyncio.create_task(asyncio.to_thread(pub.connect))
            await asyncio.gather(*(_join(syncs[n], engines[n], epoch=1) for n in engines))
            await connect
            # 1 learner + 2 + 1 workers; each engine's workers hold consecutive ranks in their own order
            assert pub.group.world_size == 4 and pub.num_engines == 2
            members = learner_rv.members(1)
            for name, engine in engines.items():
                first = min(rank for rank, w in members.items() if w == name)
                assert _group_ranks(engine) == list(range(first, first + len(engine.workers)))

            for version, dtype in [(1, None), (2, torch.bfloat16)]:
                sent = _weights(version)
                publish = asyncio.create_task(
                    asyncio.to_thread(pub.publish, list(sent.items()), version, dtype)
                )
                loaded = await asyncio.gather(*(_apply(syncs[n], engines[n], version - 1) for n in engines))
                stats = await publish
                assert stats["weight_sync/buckets"] >= 2 and stats["weight_sync/engines"] == 2
                # the counts are summed over an engine's workers: each of them loaded every tensor
                assert loaded == [2 * len(sent), len(sent)]
                expected = {k: v.to(dtype) if dtype else v for k, v in sent.items()}
                for engine in engines.values():
                    _assert_shards(engine, expected)
                assert learner_rv.acked(version) == {"tp2", "tp1"}  # one ack per engine, not per worker
        finally:
            pub.close()
            for engine in engines.values():
                engine.close()


async def test_an_engine_claiming_after_the_group_closed_joins_the_next_epoch(redis_url):
    with Rendezvous(redis_url, NS) as learner_rv, Rendezvous(redis_url, NS) as engine_rv:
        pub = WeightPublisher(learner_rv, WeightSyncConfig(backend="gloo", timeout_s=30), num_engines=1)
        engines = {"first": _FakeEngine(2), "late": _FakeEngine(2)}
        syncs = {name: EngineWeightSync(engine_rv, name) for name in engines}
        try:
            connect = asyncio.create_task(asyncio.to_thread(pub.connect))
            await _join(syncs["first"], engines["first"], epoch=1)
            await connect
            assert pub.group.world_size == 3
            # too late for epoch 1: its ranks (3, 4) lie outside the closed group, and its workers say so
            await _join(syncs["late"], engines["late"], epoch=1)
            for worker in engines["late"].workers:
                with pytest.raises(WeightSyncError, match="closed the group at 3 members"):
                    worker._ws_joiner.result()
            syncs["late"].epoch = None  # what a generator does after a failed sync
            for name in engines:
                engine_rv.announce_engine(name)
            assert pub.needs_regroup(max_age_s=0.0)

            # the next publish re-forms the group with both engines: 1 + 2 + 2 members
            sent = _weights(3)
            publish = asyncio.create_task(asyncio.to_thread(pub.publish, list(sent.items()), 3))
            await asyncio.gather(*(_join(syncs[n], engines[n], epoch=2) for n in engines))
            loaded = await asyncio.gather(*(_apply(syncs[n], engines[n], 0) for n in engines))
            await publish
            assert pub.epoch == 2 and pub.group.world_size == 5 and loaded == [2 * len(sent)] * 2
            assert sorted(r for e in engines.values() for r in _group_ranks(e)) == [1, 2, 3, 4]
            for engine in engines.values():
                _assert_shards(engine, sent)
        finally:
            pub.close()
            for engine in engines.values():
                engine.close()


@pytest.mark.parametrize(
    ("parallel", "error"),
    [
        ({"pipeline_parallel_size": 2}, "pipeline_parallel_size=2"),
        ({"data_parallel_size": 2}, "data_parallel_size=2"),
    ],
)
def test_pipeline_or_data_parallel_workers_are_refused(parallel, error):
    worker = _FakeWorker(0, 2)
    vars(worker.vllm_config.parallel_config).update(parallel)
    with pytest.raises(NotImplementedError, match=error):
        worker.ws_worker_index()
