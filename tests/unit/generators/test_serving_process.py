"""`serving_process`: while a worker serves, vLLM's environment is cached, the startup heap is frozen out of the
garbage collector and the collector runs less often; leaving restores all three, even after an error."""

from __future__ import annotations

import gc
import os

import pytest

from generators.engine import SERVING_GC_THRESHOLDS, serving_process


def test_the_process_settles_in_while_serving_and_is_restored_after(monkeypatch):
    import vllm.envs as envs

    thresholds = gc.get_threshold()
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")
    with pytest.raises(RuntimeError, match="boom"), serving_process():
        assert gc.get_threshold() == SERVING_GC_THRESHOLDS
        assert gc.get_freeze_count() > 1000  # everything imported so far
        assert envs._is_envs_cache_enabled()
        os.environ["VLLM_LOGGING_LEVEL"] = "DEBUG"
        assert envs.VLLM_LOGGING_LEVEL == "ERROR"  # cached: read once
        raise RuntimeError("boom")
    assert gc.get_threshold() == thresholds and gc.get_freeze_count() == 0
    assert not envs._is_envs_cache_enabled() and envs.VLLM_LOGGING_LEVEL == "DEBUG"
