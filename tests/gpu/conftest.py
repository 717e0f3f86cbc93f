"""The GPU tier (`make test-gpu`): tests marked `gpu` run on a CUDA device and are skipped, with the reason, where
there is none. The CPU suite collects them too and skips them the same way."""

from __future__ import annotations

import pytest


def _no_cuda_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return f"needs a CUDA GPU (torch {torch.__version__} sees none)"
    return None


def pytest_collection_modifyitems(config, items):
    """Skip every `gpu`-marked test when no CUDA device is visible."""
    reason = _no_cuda_reason()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def cuda_world():
    """A world-size-1 NCCL process group on cuda:0 for the test module."""
    from learner.distributed import init_distributed, shutdown_distributed

    yield init_distributed("cuda")
    shutdown_distributed()
