"""Stage 0's probe of the GPU check (`scripts/gpu_check.py --probe FILE`): versions, the device, a matmul rate, and how
a Qwen2.5-3B learner would run sr1's 8xH100 preset on this device; written as JSON.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path


def probe(path: Path) -> dict:
    """Versions, the device, a matmul rate (bf16 8192^3 on CUDA; fp32 512^3 on CPU) and how a Qwen2.5-3B learner of
    1 and of 6 ranks would run sr1's 8xH100 preset here (learner/execution/plan.py: each attention kernel's measured
    time, the checkpointing policy and why); written to `path` as JSON."""
    import importlib.util
    import platform

    import torch
    import transformers

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    n, dtype = (8192, torch.bfloat16) if cuda else (512, torch.float32)
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    start, runs = time.perf_counter(), 10
    for _ in range(runs):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    rate = 2 * n**3 * runs / (time.perf_counter() - start) / 1e12
    del a, b

    def version(module: str) -> str | None:
        try:
            return getattr(__import__(module), "__version__", "present")
        except ImportError:
            return None

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "triton": version("triton"),
        "pydantic": version("pydantic"),
        "flash_attn": version("flash_attn"),
        "torch_varlen_attention": importlib.util.find_spec("torch.nn.attention.varlen") is not None,
        "device": device.type,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "memory_gib": (torch.cuda.get_device_properties(0).total_memory if cuda else 0) / 2**30,
        f"matmul_{'bf16' if cuda else 'fp32'}_{n}_tflops": rate,
        "plans": execution_plans(device, "bfloat16" if cuda else "float32"),
    }
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return out


def execution_plans(
    device, dtype: str, shapes: tuple[str, ...] = ("qwen2.5-3b",), ranks: tuple[int, ...] = (1, 6)
) -> dict:
    """How the learner would run sr1's 8xH100 preset for each Qwen2.5 shape at each number of ranks on this device:
    learner/execution/plan.py's own plan (no model is loaded; `auto` attention is timed on CUDA)."""
    from config.loader import load_config
    from learner.distributed import World
    from learner.execution.plan import plan_execution
    from scripts.bench.learner_baselines import shape_config

    cfg = load_config("qwen2.5-3b-8xh100").learner.model_copy(update={"gradient_checkpointing": "auto"})
    plans = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            model_dir = Path(tmp) / shape
            shape_config(shape).save_pretrained(model_dir)
            for n in ranks:
                world = World(rank=0, world_size=n, local_rank=0, device=device, backend="none")
                try:
                    ex = plan_execution(cfg, model_dir, world, dtype, reference=True, critic=False)
                except ValueError as err:  # nothing fits
                    plans[f"{shape}/{n}"] = {"error": str(err)}
                    continue
                plans[f"{shape}/{n}"] = {
                    "attention": ex.attention,
                    "attention_seconds": ex.attention_seconds,
                    "checkpointing": ex.checkpointing,
                    "why": ex.memory.reason if ex.memory else None,
                    "keep_unsharded": ex.keep_unsharded,
                }
    return plans
