"""Loopback weight sync without vLLM: a WeightPublisher and plain receiver processes over gloo on 127.0.0.1.

Covers exact delivery (several buckets, dtype conversion, two versions), a receiver dying mid-publish, a hung
receiver, an engine that never joins, and re-opening the group under a new epoch afterwards.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest
import redis
import torch

from fakes.receiver import run_plain_receiver
from tests.timing import scaled
from weight_sync.process_group import WeightSyncError
from weight_sync.publisher import WeightPublisher
from weight_sync.rendezvous import Rendezvous
from weight_sync.settings import WeightSyncConfig

NS = "wstest"
JOIN_S = scaled(60.0)  # spawned receivers import torch first: slow on a busy 2-core machine


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(300, 64, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64, generator=g),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(64, generator=g),
        "model.layers.0.self_attn.k_proj.bias": torch.randn(64, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(128, 64, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(64, generator=g),
        "lm_head.weight": torch.randn(300, 64, generator=g),
    }


def _start(redis_url: str, worker_id: str, **kwargs) -> mp.Process:
    proc = mp.get_context("spawn").Process(
        target=run_plain_receiver,
        args=(redis_url, NS, worker_id),
        kwargs={"timeout_s": scaled(60.0), **kwargs},
        daemon=True,
    )
    proc.start()
    return proc


@pytest.fixture
def rv(redis_url):
    with Rendezvous(redis_url, NS) as rendezvous:
        yield rendezvous


def _stop(*procs: mp.Process) -> None:
    for proc in procs:
        proc.join(timeout=scaled(10))
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_publish_delivers_every_tensor_exactly_to_every_receiver(redis_url, rv, tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    # Receivers as threads here (each builds its own group member, exactly as a process would): no spawn cost.
    errors: list[BaseException] = []

    def receive(worker_id: str, save_dir: str) -> None:
        try:
            run_plain_receiver(
                redis_url, NS, worker_id, num_updates=2, save_dir=save_dir, timeout_s=scaled(60.0)
            )
        except BaseException as exc:
            errors.append(exc)

    procs = [threading.Thread(target=receive, args=(f"eng{i}", str(d))) for i, d in enumerate(dirs)]
    for proc in procs:
        proc.start()
    # ~50 KB buckets: several per update; tensors of 16 KB or more alone, sent in place when no conversion is needed
    cfg = WeightSyncConfig(backend="gloo", bucket_mb=0.05, in_place_mb=2**-6, timeout_s=30)
    pub = WeightPublisher(rv, cfg, num_engines=2)
    try:
        pub.connect()
        sent1 = _weights(1)
        stats = pub.publish(sent1.items(), version=1)
        assert stats["weight_sync/buckets"] >= 3
        assert stats["weight_sync/bytes"] >= sum(t.numel() * t.element_size() for t in sent1.values())
        # every tensor alone in its bucket goes in place (up_proj as bf16, its own dtype); the two biases share one
        total = sum(t.numel() * t.element_size() for t in sent1.values())
        assert stats["weight_sync/in_place_bytes"] == total - 2 * 64 * 4
        sent2 = _weights(2)
        stats = pub.publish(sent2.items(), version=2, dtype=torch.bfloat16)
        # as bf16 only up_proj is already in the wire dtype: the fp32 tensors are converted into staging
        assert stats["weight_sync/in_place_bytes"] == 128 * 64 * 2
    finally:
        pub.close()
        for proc in procs:
            proc.join(timeout=scaled(30))
    assert not errors, errors
    from safetensors.torch import load_file

    for d in dirs:
        got1, got2 = load_file(d / "v1.safetensors"), load_file(d / "v2.safetensors")
        assert list(got1) and set(got1) == set(sent1)
        for name, tensor in sent1.items():
            assert got1[name].dtype == tensor.dtype and torch.equal(got1[name], tensor), name
        for name, tensor in sent2.items():
            assert got2[name].dtype == torch.bfloat16
            assert torch.equal(got2[name], tensor.to(torch.bfloat16)), name


@pytest.mark.slow
def test_receiver_dying_mid_publish_makes_publish_raise_then_a_new_epoch_works(redis_url, rv, tmp_path):
    healthy = _start(redis_url, "healthy", num_updates=1)
    dying = _start(redis_url, "dying", die_after_buckets=1)
    cfg = WeightSyncConfig(backend="gloo", bucket_mb=0.05, timeout_s=5)
    pub = WeightPublisher(rv, cfg, num_engines=2)
    try:
        pub.connect(timeout_s=JOIN_S)
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match="version 1") as info:
            pub.publish(_weights(1).items(), version=1)
        assert time.monotonic() - start < cfg.timeout_s + scaled(
            5
        )  # its timeout, plus the machine's overhead
        assert "dying" in str(info.value)
        assert pub.group is None  # dropped: the next publish re-opens it
        _stop(dying, healthy)
        # A restarted engine joins the new epoch and receives the next version.
        out = tmp_path / "new"
        out.mkdir()
        fresh = _start(redis_url, "restarted", num_updates=1, save_dir=str(out))
        pub.num_engines = 1
        pub.connect(timeout_s=JOIN_S)
        sent = _weights(2)
        pub.publish(sent.items(), version=2)
        assert pub.epoch == 2
        _stop(fresh)
        assert fresh.exitcode == 0
    finally:
        pub.close()
        _stop(healthy, dying)
    from safetensors.torch import load_file

    got = load_file(out / "v2.safetensors")
    assert all(torch.equal(got[k], v) for k, v in sent.items())


def test_hung_receiver_makes_publish_raise_within_the_timeout(redis_url, rv):
    stalled = _start(redis_url, "stalled", stall=True)
    cfg = WeightSyncConfig(backend="gloo", bucket_mb=1, timeout_s=3)
    pub = WeightPublisher(rv, cfg, num_engines=1)
    try:
        pub.connect(timeout_s=JOIN_S)
        start = time.monotonic()
        # 8 MB: more than socket buffers absorb, so the broadcast itself must time out (or the ack wait does).
        big = {f"w{i}": torch.zeros(1024, 1024) for i in range(2)}
        with pytest.raises((WeightSyncError, TimeoutError), match="stalled"):
            pub.publish(big.items(), version=1)
        assert time.monotonic() - start < 2 * cfg.timeout_s + scaled(5)
    finally:
        pub.close()
        stalled.kill()
        stalled.join()


def test_connect_names_the_missing_engines(rv):
    def one_engine_claims():  # an engine that claims its rank; the second engine never comes
        deadline = time.monotonic() + scaled(10)
        while (info := rv.read()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        rv.claim_rank(info["epoch"], "only-one")

    claimer = threading.Thread(target=one_engine_claims)
    claimer.start()
    pub = WeightPublisher(rv, WeightSyncConfig(backend="gloo", timeout_s=30), num_engines=2)
    try:
        with pytest.raises(TimeoutError, match=r"1 of 2 engines joined.*only-one"):
            pub.connect(timeout_s=2)
    finally:
        pub.close()
        claimer.join()


def test_no_engines_publish_returns_at_once(redis_url, rv):
    pub = WeightPublisher(rv, WeightSyncConfig(backend="gloo"), num_engines=0)
    pub.connect()
    stats = pub.publish(_weights(0).items(), version=3)
    assert stats["weight_sync/buckets"] == 0
    r = redis.Redis.from_url(redis_url)
    assert r.get(f"{NS}:ws:update") is None
    r.close()
    pub.close()


class _DiesWhenGathered:
    """Stands in for a DTensor whose gather never happens: the learner process dies there, mid-publish."""

    def __init__(self, shape):
        self.shape = torch.Size(shape)
        self.dtype = torch.float32

    def detach(self):
        return self

    def full_tensor(self):
        import os

        os._exit(1)


def _learner_that_dies_mid_publish(redis_url: str) -> None:
    rv = Rendezvous(redis_url, NS)
    pub = WeightPublisher(rv, WeightSyncConfig(backend="gloo", bucket_mb=0.05, timeout_s=3), num_engines=1)
    pub.connect(timeout_s=JOIN_S)
    named = [("first", torch.ones(100, 100)), ("second", _DiesWhenGathered([100, 100]))]
    pub.publish(named, version=1)


def test_engine_side_raises_within_the_timeout_when_the_learner_dies(redis_url, rv):
    from weight_sync.process_group import make_group, open_store
    from weight_sync.receiver import receive_update

    learner = mp.get_context("spawn").Process(
        target=_learner_that_dies_mid_publish, args=(redis_url,), daemon=True
    )
    learner.start()
    try:
        deadline = time.monotonic() + JOIN_S
        while (info := rv.read()) is None:
            assert time.monotonic() < deadline, "the learner never published a rendezvous"
            time.sleep(0.02)
        rank = rv.claim_rank(info["epoch"], "survivor")
        store = open_store(info["addr"], info["port"], is_master=False, timeout_s=30)
        group = make_group(store, rank=rank, world_size=2, backend="gloo", epoch=info["epoch"], timeout_s=3)
        while (update := rv.latest_update()) is None:
            assert time.monotonic() < deadline, "the learner never announced an update"
            time.sleep(0.01)
        assert len(update["buckets"]) == 2
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"receiving bucket [12]/2 of version 1"):
            receive_update(group, update)
        assert time.monotonic() - start < 3 + scaled(5)  # the group's 3 s timeout, plus overhead
        group.close()
    finally:
        _stop(learner)
    assert learner.exitcode == 1


@pytest.mark.slow
def test_two_fsdp_ranks_publish_bf16_that_equals_the_full_weights_cast(
    redis_url, tmp_path, tiny_model_dir, free_port
):
    """A 2-rank gloo FSDP2 learner publishes its fp32 weights as bf16 (the shards are cast, then gathered) to a
    receiver process: every tensor arrives equal to the unsharded fp32 weight cast to bf16."""
    from safetensors.torch import load_file

    from fakes.weight_sync import fsdp_learner_rank, perturbed_model

    ns, version = "wsfsdp", 5
    ctx = mp.get_context("spawn")
    receiver = ctx.Process(
        target=run_plain_receiver,
        args=(redis_url, ns, "eng0"),
        kwargs={"timeout_s": scaled(120.0), "save_dir": str(tmp_path)},
        daemon=True,
    )
    ranks = [
        ctx.Process(
            target=fsdp_learner_rank,
            args=(rank, 2, free_port, str(tiny_model_dir), redis_url, ns, 3, version),
            kwargs={"dtype": "bfloat16"},
        )
        for rank in range(2)
    ]
    for proc in [receiver, *ranks]:
        proc.start()
    try:
        for proc in [*ranks, receiver]:
            proc.join(timeout=scaled(120))
        assert [proc.exitcode for proc in ranks] == [0, 0] and receiver.exitcode == 0
    finally:
        _stop(receiver, *ranks)
    got = load_file(tmp_path / f"v{version}.safetensors")
    sent = dict(perturbed_model(tiny_model_dir, seed=3).named_parameters())
    assert set(got) == set(sent)
    for name, param in sent.items():
        assert got[name].dtype == torch.bfloat16, name
        assert torch.equal(got[name], param.detach().to(torch.bfloat16)), name
