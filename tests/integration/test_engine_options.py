"""The `generators.engine` options reach vLLM as set: the engine configuration vLLM builds from them (its own
`AsyncEngineArgs.create_engine_config`, the platform's adjustments included) for the tiny preset's engine, without
starting one.

- `enforce_eager`: no compilation (mode NONE), so no inductor compile, graph capture or warm-up at the start;
- `cpu_kvcache_gb`: the KV cache in bytes, fractions of a GiB included; an environment's VLLM_CPU_KVCACHE_SPACE
  still wins (vLLM reads it last);
- `block_size`, `max_num_seqs` and `extra_args` (which win over the fields).
"""

from __future__ import annotations

import pytest

from config import load_config
from generators.engine import GIB, engine_args


def vllm_config(args):
    from vllm import AsyncEngineArgs

    return AsyncEngineArgs(**args).create_engine_config()


@pytest.fixture(scope="module")
def tiny_engine():
    return load_config("tiny").generators.engine


def test_the_tiny_presets_engine_options_reach_vllm(tiny_model_dir, tiny_engine, monkeypatch):
    from vllm.config import CompilationMode

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    args = engine_args(str(tiny_model_dir), tiny_engine, dtype="float32", max_model_len=512, cpu=True)
    config = vllm_config(args)
    assert tiny_engine.enforce_eager and config.compilation_config.mode == CompilationMode.NONE
    assert config.cache_config.kv_cache_memory_bytes == int(tiny_engine.cpu_kvcache_gb * GIB)
    assert (
        tiny_engine.cpu_kvcache_gb < 1
    )  # a fraction of a GiB: what the whole-GiB environment variable cannot say
    assert config.cache_config.block_size == tiny_engine.block_size
    assert config.scheduler_config.max_num_seqs == tiny_engine.max_num_seqs


def test_the_environment_and_extra_args_win_and_without_enforce_eager_vllm_would_compile(
    tiny_model_dir, tiny_engine, monkeypatch
):
    from vllm.config import CompilationMode

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    cfg = tiny_engine.model_copy(update={"enforce_eager": False, "extra_args": {"max_num_seqs": 7}})
    config = vllm_config(engine_args(str(tiny_model_dir), cfg, dtype="float32", max_model_len=512, cpu=True))
    assert config.cache_config.kv_cache_memory_bytes == 2 * GIB
    assert config.scheduler_config.max_num_seqs == 7
    assert config.compilation_config.mode != CompilationMode.NONE  # the option is what turns compiling off


def test_gpu_builds_get_no_kv_cache_bytes(tiny_engine):
    args = engine_args("m", tiny_engine, dtype="bfloat16", max_model_len=512, cpu=False)
    assert (
        "kv_cache_memory_bytes" not in args
        and args["gpu_memory_utilization"] == tiny_engine.gpu_memory_utilization
    )
