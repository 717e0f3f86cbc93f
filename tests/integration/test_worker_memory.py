"""scripts/bench/worker_memory.py on the session's engine: weight updates applied as a generator worker applies them, with
generation between them, and the worker's memory sampled through the extension's `ws_memory`."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture(scope="module")
def worker_memory():
    from scripts.bench import worker_memory

    return worker_memory


async def test_updates_are_applied_and_the_worker_sampled_every_n(
    worker_memory, vllm_engine, tiny_model_dir, redis_url
):
    lines: list[str] = []
    samples = await worker_memory.measure(
        vllm_engine, redis_url, tiny_model_dir, updates=6, every=3, report=lines.append
    )
    assert vllm_engine.version == 6  # every update was loaded
    assert [s["update"] for s in samples] == [0, 3, 6] and len(lines) == 3
    assert all(
        s["rss_mib"] > 100 for s in samples
    )  # a vLLM worker with torch loaded, not this process's figure
    if "in_use_mib" in samples[0]:  # glibc 2.33+
        assert all(s["in_use_mib"] > 0 for s in samples)
    change = worker_memory.growth(samples, warmup=3)
    assert set(change) >= {"rss_mib"}
    assert change["rss_mib"]["mib"] == pytest.approx(samples[-1]["rss_mib"] - samples[1]["rss_mib"])
