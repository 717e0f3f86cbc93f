"""`learner.attention: auto` on CUDA: the fastest packed-row attention present, measured on this GPU, not assumed.

    name, timings = choose_attention(device, "auto", heads=16, kv_heads=2, head_dim=128, dtype=torch.bfloat16,
                                     tokens=16384)

The candidates are the CUDA kernels this installation has for the compute dtype (flash_attention_2 with flash-attn,
sr1_torch_varlen with a torch that has `torch.nn.attention.varlen`, both bf16/fp16 only; sr1_flex_document always).
Each runs a forward and a backward on a representative packed row: `tokens` tokens (the micro-batch budget, at most
16,384) of Search-R1-like trajectories (a fixed draw, about 1,350 tokens each, at most 4,096), the model's heads,
K/V heads and head size, the compute dtype, through the same function the model's layers call. Two untimed runs (FlexAttention compiles in the first), then
three timed ones; the median wins. A kernel that fails on this GPU (an architecture or dtype it does not support) is
left out and the failure logged.

The result is cached per GPU, torch version and shape: in this process, and in `$XDG_CACHE_HOME/sr1/attention.json`
(`~/.cache/...`), so a second run on the same machine does not measure again. The learner logs the choice and the
timings. On CPU `auto` is the per-sequence SDPA loop, unmeasured (learner/execution/attention.py says why).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from learner.execution.attention import (
    FLASH_VARLEN,
    FLEX_DOCUMENT,
    VARLEN_TORCH,
    attention_implementation,
    document_causal_block_mask,
    flash_attn_installed,
    flex_document_forward,
    torch_varlen_available,
    torch_varlen_forward,
)
from learner.execution.device import host_to_device

log = logging.getLogger(__name__)

MAX_PROBE_TOKENS = 16384
_cache: dict[str, tuple[str, dict[str, float]]] = {}


def cuda_candidates(dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """The packed-row kernels this installation can run on CUDA in `dtype`, in the order ties are broken (the
    flash-attention kernels take bf16 and fp16 only)."""
    half = dtype in (torch.bfloat16, torch.float16)
    return (
        ([FLASH_VARLEN] if half and flash_attn_installed() else [])
        + ([VARLEN_TORCH] if half and torch_varlen_available() else [])
        + [FLEX_DOCUMENT]
    )


def probe_lengths(tokens: int, seed: int = 0) -> list[int]:
    """Sequence lengths filling a row of `tokens`: a fixed draw shaped like Search-R1 trajectories (lognormal around
    1,350 tokens, 200 to 4,096), the last one cut to fit."""
    rng = np.random.default_rng(seed)
    lengths, total = [], 0
    while total < tokens:
        length = int(np.clip(rng.lognormal(np.log(1350), 0.5), 200, 4096))
        length = min(length, tokens - total)
        lengths.append(length)
        total += length
    return lengths


def _attend(name: str, seq_lens: list[int], device: torch.device):
    """Kernel `name` as a decoder layer calls it on a packed row of `seq_lens`: f(q, k, v) -> output. What is built
    once per micro-batch (the BlockMask, the boundaries) is built here, outside the timed calls."""
    module = SimpleNamespace(training=True)
    if name == FLEX_DOCUMENT:
        mask = document_causal_block_mask(seq_lens, device)
        return lambda q, k, v: flex_document_forward(module, q, k, v, mask)[0]
    bounds = host_to_device(torch.tensor(np.cumsum([0, *seq_lens]), dtype=torch.int32), device)
    longest = max(seq_lens)
    kwargs = {
        "cu_seq_lens_q": bounds,
        "cu_seq_lens_k": bounds,
        "max_length_q": longest,
        "max_length_k": longest,
    }
    if name == VARLEN_TORCH:
        return lambda q, k, v: torch_varlen_forward(module, q, k, v, None, **kwargs)[0]
    from transformers.integrations.flash_attention import flash_attention_forward

    layer = SimpleNamespace(training=True, is_causal=True, config=SimpleNamespace())
    return lambda q, k, v: flash_attention_forward(layer, q, k, v, None, **kwargs)[0]


def time_kernel(name: str, heads: int, kv_heads: int, head_dim: int, dtype, tokens: int, device) -> float:
    """Median seconds of a forward and backward of `name` on the probe row (two untimed runs first)."""
    seq_lens = probe_lengths(min(tokens, MAX_PROBE_TOKENS))
    total = sum(seq_lens)
    generator = torch.Generator(device=device).manual_seed(0)

    # (1, H, T, D) views of (1, T, H, D) memory, as a layer's projections hand them to the attention
    leaves = [
        torch.randn(1, total, h, head_dim, device=device, dtype=dtype, generator=generator).requires_grad_()
        for h in (heads, kv_heads, kv_heads)
    ]
    attend = _attend(name, seq_lens, device)
    times = []
    for i in range(5):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        attend(*(leaf.transpose(1, 2) for leaf in leaves)).float().square().mean().backward()
        torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
        for leaf in leaves:
            leaf.grad = None
    return statistics.median(times)


def _cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "sr1" / "attention.json"


def _read_disk_cache() -> dict:
    try:
        return json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _write_disk_cache(key: str, name: str, timings: dict[str, float]) -> None:
    data = _read_disk_cache()
    data[key] = {"choice": name, "seconds": timings}
    try:
        path = _cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as exc:  # a read-only home: measure again next time
        log.debug("attention choice not cached on disk: %s", exc)


def choose_attention(
    device: torch.device,
    requested: str,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    tokens: int,
) -> tuple[str, dict[str, float]]:
    """The attention for packed rows and, when `auto` measured it, each candidate's seconds per forward+backward of
    the probe row ({} otherwise). Named choices are checked, not measured; CPU's auto is the loop."""
    if requested != "auto" or device.type != "cuda":
        return attention_implementation(device, requested), {}
    candidates = cuda_candidates(dtype)
    key = "|".join(
        map(
            str,
            (torch.cuda.get_device_name(device), torch.__version__, heads, kv_heads, head_dim, dtype, tokens),
        )
    )
    key = f"{key}|{','.join(candidates)}"
    if key not in _cache:
        stored = _read_disk_cache().get(key)
        if stored and stored.get("choice") in candidates:
            _cache[key] = stored["choice"], stored["seconds"]
        else:
            timings = {}
            for name in candidates:
                try:
                    timings[name] = time_kernel(name, heads, kv_heads, head_dim, dtype, tokens, device)
                except Exception as exc:  # noqa: BLE001 - a kernel this GPU cannot run is left out, loudly
                    log.warning("attention %s left out of auto: it failed on %s: %s", name, device, exc)
            if not timings:
                raise RuntimeError(
                    f"no packed-row attention kernel ran on {device} (tried {', '.join(candidates)})"
                )
            _cache[key] = min(timings, key=timings.get), timings
            _write_disk_cache(key, *_cache[key])
    name, timings = _cache[key]
    return attention_implementation(device, name), timings
