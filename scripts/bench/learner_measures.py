"""How scripts/bench/bench_learner.py measures a step: the timer of each mode (seconds, tokens and the allocator's
peak, turned into tokens/s, MFU and peak GiB), the matmul FLOPs a trained token costs (full weights or LoRA), what
ran where (versions, commit, GPU), a progress line while a long step runs, one step under torch.profiler, and
learner/execution/memory.py's estimate of the step's peak.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def train_flops_per_token(parameters: int, trained: int | None = None) -> int:
    """Matmul FLOPs of one trained token through a model of `parameters` of which `trained` get weight gradients
    (default: all): the forward (2 x parameters), the activations' gradients (2 x parameters) and the trained
    weights' gradients (2 x trained). Full weights: 6P. LoRA on a frozen base of B parameters with A adapter
    parameters (parameters = B + A, trained = A): 4B + 6A, the count sr1/plan/lora.py derives a LoRA learner's
    tokens/s from. Recomputation, attention's quadratic term and the padding FlexAttention adds are not counted."""
    return 4 * parameters + 2 * (parameters if trained is None else trained)


class Timer:
    """Seconds, tokens and the allocator's peak of each timed step of one mode."""

    def __init__(self, device):
        self.device, self.seconds, self.tokens, self.peak = device, 0.0, 0, 0

    def __call__(self, run, tokens: int) -> None:
        import torch

        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize(self.device)
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device))
        self.seconds += time.perf_counter() - start
        self.tokens += tokens

    def figures(
        self,
        name: str,
        parameters: int,
        peak_flops: float | None,
        no_grad_passes: float,
        trained: int | None = None,
    ) -> dict:
        """tokens/s, seconds, MFU on the trained FLOPs (`train_flops_per_token`; `trained`: the parameters with
        weight gradients, default all), with each no-gradient forward's 2 x parameters in `mfu_all_passes`, and
        the peak GiB on CUDA."""
        tokens_per_s = self.tokens / self.seconds
        out = {f"{name}/tokens_per_s": tokens_per_s, f"{name}/seconds": self.seconds}
        if peak_flops:
            flops = train_flops_per_token(parameters, trained)
            out[f"{name}/mfu"] = flops * tokens_per_s / peak_flops
            if no_grad_passes:
                out[f"{name}/mfu_all_passes"] = (
                    (flops + 2 * no_grad_passes * parameters) * tokens_per_s / peak_flops
                )
        if self.device.type == "cuda":
            out[f"{name}/peak_gib"] = self.peak / 2**30
        return out


def provenance(device) -> dict:
    import torch
    import transformers

    out = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    try:  # a copy of the tree may come without git or without .git
        git = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        out["commit"] = git.stdout.strip() if git.returncode == 0 else None
    except OSError:
        out["commit"] = None
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


@contextlib.contextmanager
def progress(what: str):
    """A line on stderr when `what` starts, every 10 s while it runs, and when it ends."""
    start = time.perf_counter()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(10):
            print(f"  {what}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)

    print(f"{what} ...", file=sys.stderr, flush=True)
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        print(f"{what}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


def trained_parameters(learner) -> int:
    """The policy's parameters that get weight gradients: all of them, or with learner.lora the adapters only."""
    return sum(p.numel() for p in learner.model.parameters() if p.requires_grad)


def estimate_peak_bytes(learner, parameters: int, tokens: int) -> float | None:
    """learner/execution/memory.py's estimate of this step's peak at a micro-batch of `tokens`, with the settings the
    learner runs (None: the estimate does not know the model). With learner.lora, `parameters` (base and adapters)
    splits into the frozen base and the adapters, as the estimate counts them."""
    from learner.execution import memory

    ex, cfg = learner.execution, learner.cfg
    adapters = trained_parameters(learner) if cfg.lora is not None else 0
    try:
        return memory.estimate_peak_bytes(
            learner.model.config,
            parameters - adapters,
            world_size=learner.world.world_size,
            dtype=learner.model_dtype,
            checkpointing=ex.checkpointing,
            every=ex.checkpointing_every,
            micro_batch_tokens=tokens,
            chunk_tokens=cfg.logprob_chunk_tokens,
            reference=learner.reference is not None,
            critic=learner.critic is not None,
            cpu_offload=cfg.cpu_offload,
            compiled=ex.compile,
            fused_head=ex.logprob_head == "fused",
            keep_unsharded=ex.keep_unsharded,
            defer_grad_sync=ex.defer_grad_sync,
            lora_parameters=adapters,
        )
    except ValueError:
        return None


def profile_step(step, device, rows: int) -> dict:
    """One step under torch.profiler: its top ops by device (or CPU) time to stderr, and into the figures."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as trace:
        step()
    averages = trace.key_averages()
    sort = "device_time_total" if cuda else "cpu_time_total"
    print(averages.table(sort_by=sort, row_limit=rows), file=sys.stderr)

    def device_us(event) -> float:
        return float(getattr(event, "self_device_time_total", 0.0) or 0.0)

    top = sorted(averages, key=lambda e: device_us(e) if cuda else e.self_cpu_time_total, reverse=True)[:rows]
    return {
        "profile/cpu_ms": sum(e.self_cpu_time_total for e in averages) / 1e3,
        "profile/device_ms": sum(device_us(e) for e in averages) / 1e3,
        "profile/top": [
            {
                "op": e.key,
                "calls": e.count,
                "self_device_ms": device_us(e) / 1e3,
                "self_cpu_ms": e.self_cpu_time_total / 1e3,
            }
            for e in top
        ],
    }
