"""LoRA on the engines: which adapter a request samples with (`AdapterSet`, both policies), when an older adapter
is removed, the probe check's named error, the engine arguments and the config wiring from `learner.lora`."""

from __future__ import annotations

from collections import namedtuple

import pytest

from config.schema import Config
from generators.adapters import AdapterMismatch, AdapterSet, check_probe, probe_difference
from generators.engine import engine_args, vllm_lora_rank
from generators.settings import EngineConfig, EngineLoraConfig

Request = namedtuple("Request", "lora_name lora_int_id lora_path")


def _loaded(adapters: AdapterSet, version: int) -> Request:
    request = adapters.make_request(version, Request)
    adapters.path(version).mkdir(parents=True)
    adapters.add(version, request)
    return request


def test_a_request_keeps_its_adapter_to_the_end_and_old_ones_go_when_unused(tmp_path):
    adapters = AdapterSet(EngineLoraConfig(rank=8, policy="keep_to_end"), tmp_path)
    assert adapters.acquire() == (0, None)  # version 0: the base model, no adapter
    v1 = _loaded(adapters, 1)
    assert v1 == Request("sr1-v1", 1, str(tmp_path / "sr1-v1"))
    assert adapters.acquire(pinned=0) == (0, None)  # a trajectory started on v0 keeps it while held
    adapters.release(0)
    adapters.release(0)
    assert adapters.retire() == []  # the base model has no adapter to remove
    assert adapters.versions() == {1: 0}
    held = adapters.acquire()
    assert held == (1, v1)
    v2 = _loaded(adapters, 2)
    assert adapters.acquire(pinned=1) == (1, v1)
    assert adapters.retire() == []  # v1 is still in use by two requests
    adapters.release(1)
    adapters.release(1)
    assert adapters.retire() == [v1]
    assert not (tmp_path / "sr1-v1").exists() and (tmp_path / "sr1-v2").exists()
    # a pinned version the engine no longer holds: the newest
    assert adapters.acquire(pinned=1) == (2, v2)


def test_newest_at_turn_ignores_the_pinned_version(tmp_path):
    adapters = AdapterSet(EngineLoraConfig(rank=8, policy="newest_at_turn"), tmp_path)
    acquired = adapters.acquire()
    v1 = _loaded(adapters, 1)
    assert adapters.acquire(pinned=0) == (1, v1)
    adapters.release(acquired[0])
    assert adapters.versions() == {0: 0, 1: 1}


def test_the_same_version_twice_gets_a_new_vllm_id(tmp_path):
    adapters = AdapterSet(EngineLoraConfig(rank=8), tmp_path, initial_version=3)
    first = _loaded(adapters, 4)
    adapters.acquire()
    adapters.path(4).rmdir()
    second = adapters.make_request(4, Request)
    adapters.add(4, second)
    assert second.lora_int_id != first.lora_int_id and adapters.versions()[4] == 1  # the user is kept


def test_a_probe_off_by_more_than_the_tolerance_is_an_adapter_mismatch():
    probe = {"token_ids": [1, 2, 3], "logprobs": [-1.0, -2.0]}
    assert check_probe(1, [-1.001, -2.001], probe, 0.05)["mean_abs"] == pytest.approx(0.001)
    with pytest.raises(AdapterMismatch, match=r"AdapterMismatch: after loading version 7 .* by 0\.5000"):
        check_probe(7, [-1.5, -2.5], probe, 0.05)
    assert probe_difference([-1.0, -2.0], [-1.0, -2.0])["kl"] == 0.0
    with pytest.raises(ValueError, match="the engine scored 1 tokens, the learner 2"):
        check_probe(1, [-1.0], probe, 0.05)


def test_engine_args_turn_lora_on_with_a_rank_vllm_accepts():
    lora = EngineLoraConfig(rank=12, max_loras=4)
    args = engine_args("m", EngineConfig(), dtype="float32", max_model_len=512, lora=lora)
    assert (args["enable_lora"], args["max_lora_rank"], args["max_loras"], args["max_cpu_loras"]) == (
        True,
        16,
        4,
        4,
    )
    assert "enable_lora" not in engine_args("m", EngineConfig(), dtype="float32", max_model_len=512)
    assert "enable_lora" not in engine_args(
        "m", EngineConfig(), dtype="float32", max_model_len=512, lora=EngineLoraConfig()
    )
    assert [vllm_lora_rank(r) for r in (1, 2, 16, 17, 300)] == [1, 8, 16, 32, 320]
    with pytest.raises(ValueError, match="LoRA rank 600 is above the largest vLLM serves"):
        vllm_lora_rank(600)


def test_the_config_sizes_the_engines_lora_from_the_learner():
    small = {"max_response_tokens": 512}
    plain = Config(generators=small).generator_job().generators.lora
    assert plain.rank is None
    job = Config(generators=small, learner={"lora": {"rank": 8}, "max_staleness": 3}).generator_job()
    assert (job.generators.lora.rank, job.generators.lora.max_loras) == (8, 5)
    auto = {"lora": {"rank": 8}, "max_staleness": {"auto": {"ceiling": 6}}}
    assert Config(generators=small, learner=auto).generator_job().generators.lora.max_loras == 8
    mine = Config(generators={**small, "lora": {"max_loras": 2, "policy": "newest_at_turn"}}, learner=auto)
    assert mine.generator_job().generators.lora.max_loras == 2
    with pytest.raises(ValueError, match="generators.lora.rank is set but learner.lora is not"):
        Config(generators={**small, "lora": {"rank": 8}})


def test_an_adapter_kept_by_a_broken_load_goes_with_its_files_once_replaced(tmp_path):
    adapters = AdapterSet(EngineLoraConfig(rank=8), tmp_path)
    v1 = _loaded(adapters, 1)
    adapters.path(2).mkdir()  # version 2 was received, but the engine kept sampling with sr1-v1
    adapters.add(2, v1)
    assert adapters.retire() == []  # sr1-v1 is what new requests still get
    assert (tmp_path / "sr1-v1").exists()
    v3 = _loaded(adapters, 3)
    assert adapters.retire() == [v1]
    assert not (tmp_path / "sr1-v1").exists() and not (tmp_path / "sr1-v2").exists()
    assert adapters.versions() == {3: 0}
    assert (tmp_path / "sr1-v3").exists() and v3.lora_name == "sr1-v3"
