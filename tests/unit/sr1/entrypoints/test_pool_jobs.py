"""The pools' entry points load their job the same way: `--config`, the overrides, `--redis-url`, or a clear exit."""

from __future__ import annotations

import importlib

import pytest

from config import EXIT_BAD_INPUT, GeneratorJob
from sr1 import entrypoints
from sr1.entrypoints import load_pool_job


@pytest.mark.parametrize("module", [entrypoints.LEARNER, entrypoints.GENERATORS])
def test_a_pool_process_without_a_redis_url_exits_with_the_bad_input_status(module, capsys):
    main = importlib.import_module(module).main
    assert main(["--config", "tiny"]) == EXIT_BAD_INPUT  # the tiny preset names no Redis
    assert "no Redis URL: pass --redis-url or set buffer.redis_url" in capsys.readouterr().err


def test_the_redis_url_flag_is_the_jobs_buffer_url_and_the_overrides_apply():
    job = load_pool_job(GeneratorJob, "tiny", ["generators.group_size=3"], "redis://h:1/0")
    assert (job.buffer.redis_url, job.generators.group_size) == ("redis://h:1/0", 3)
