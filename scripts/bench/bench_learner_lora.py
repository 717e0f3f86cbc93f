"""The LoRA learner step against the full-weight step on the same model, on CPU (`learner.lora`, docs/lora.md).

    python scripts/bench/bench_learner.py --lora [--steps 3] [--rank 16] [--dtype float32|bfloat16] [--json]
    python scripts/bench/bench_learner_lora.py [same options]
    python scripts/bench/bench_learner.py --lora --model runs/.world-cache/seed0/model   # the tiny world's policy

One run: each mode (full weights, then LoRA) in its own child process, on the same random-init Qwen2 (hidden 384,
6 layers, 4,096-token vocabulary: 12.6 M parameters; or the Qwen2 model `--model` names) and the same batches (the `tiny` toy mix of
scripts/bench/learner_workloads.py, 8 groups of 8), one gloo rank, one warm-up step, then `--steps` timed
`Learner.train_step`s. Figures per mode:
- tokens/s: every token through the policy per second of `train_step`;
- training state: the bytes of the parameters, their gradients (fp32, one per trained parameter) and AdamW's state,
  counted from the tensors themselves (exact, whatever the machine);
- peak RSS: the child's resident high-water mark (`ru_maxrss`) less its resident size just before the model
  loaded (the interpreter, torch, PEFT and the batches), so it counts what the learner allocated, activations
  included. Both modes import PEFT first: its import alone adds about 260 MB of resident memory (transformers'
  and PEFT's modules), a cost per process and not the step's (`peft_import` in the JSON, measured in each child).
`--plain` measures the same without sr1's learner: transformers' own forward and backward of 4,096-token rows, with
PEFT's adapters put on as the learner puts them (`learner.lora.inject_lora`: every linear layer, the rest frozen) or
not, no optimizer: whether a difference is the learner's or PEFT's. The ratios LoRA / full are printed last.
Timings on a shared CPU are noisy: compare the ratio, measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODES = ("full", "lora")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode (after one warm-up)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="model.dtype (CPU presets: float32)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each child")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--model", help="a Qwen2 model directory instead of the bench's own 12.6 M model")
    parser.add_argument(
        "--plain", action="store_true", help="transformers + PEFT alone, without sr1's learner"
    )
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rank < 1 or args.threads < 1:
        parser.error(
            f"--steps, --rank and --threads must be >= 1, got {args.steps}, {args.rank}, {args.threads}"
        )
    return args


def build_model(out_dir: Path) -> str:
    from world.model import build_model as build
    from world.model import train_tokenizer

    texts = [f"alpha bravo {i} charlie delta echo {i * 7} foxtrot {i % 13}" for i in range(2000)]
    train_tokenizer(texts, out_dir, vocab_size=4096)
    return str(
        build(
            out_dir,
            out_dir,
            hidden_size=384,
            num_layers=6,
            num_heads=6,
            num_kv_heads=2,
            intermediate_size=1024,
            max_positions=1024,
        )
    )


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_since(baseline: int) -> int:
    """The process's resident high-water mark (`ru_maxrss`) less `baseline` bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline


def _state_bytes(model, optimizer=None) -> dict[str, int]:
    """Parameters, their (fp32) gradients and the optimizer's state (none without one), from the tensors."""

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    params = [local(p) for p in model.parameters()]
    trained = [local(p) for p in model.parameters() if p.requires_grad]
    states = optimizer.state.values() if optimizer is not None else []
    optim = [local(v) for s in states for v in s.values() if hasattr(v, "numel")]
    return {
        "parameters": sum(p.numel() * p.element_size() for p in params),
        "gradients": sum(p.numel() * 4 for p in trained),
        "optimizer": sum(v.numel() * v.element_size() for v in optim),
        "trained_parameters": sum(p.numel() for p in trained),
        "all_parameters": sum(p.numel() for p in params),
    }


def _lora_settings(args):
    """The mode's `learner.lora` (alpha = 2 x rank), None for full weights."""
    from learner.settings import LoraSettings

    return LoraSettings(rank=args.rank, alpha=2.0 * args.rank) if args.child == "lora" else None


def plain_child(args) -> dict:
    """`--plain`: one mode with transformers' forward/backward, the adapters put on as the learner puts them
    (`learner.lora.inject_lora`), and nothing else of the learner (no packing, head, FSDP or optimizer)."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from learner.lora import inject_lora

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=dtype)
    if (lora := _lora_settings(args)) is not None:
        inject_lora(model, lora, dtype)
    vocab = min(4000, model.config.vocab_size)
    rows = torch.randint(0, vocab, (args.steps + 1, 1, 4096), generator=torch.Generator().manual_seed(0))
    baseline = _rss_bytes()
    seconds = 0.0
    for i, ids in enumerate(rows):
        start = time.perf_counter()
        model(input_ids=ids).logits.float().log_softmax(-1).mean().backward()
        seconds += time.perf_counter() - start if i else 0.0  # the first row warms up
    return {
        "tokens_per_s": args.steps * 4096 / seconds,
        "peak_rss": _peak_rss_since(baseline),
    } | {f"state/{k}": v for k, v in _state_bytes(model).items()}


def child(args) -> dict:
    """One mode, in this process: warm-up, timed steps, figures."""
    import time

    import numpy as np
    import torch

    import scripts.bench.learner_workloads as workloads
    from learner.distributed import init_distributed, shutdown_distributed
    from learner.settings import LearnerConfig
    from learner.trainer import Learner

    torch.set_num_threads(args.threads)
    before_peft = _rss_bytes()
    from peft import LoraConfig, inject_adapter_in_model  # noqa: F401  (the LoRA learner's: before the baseline)

    peft_import = _rss_bytes() - before_peft
    rng = np.random.default_rng(0)
    vocab = min(4000, json.loads((Path(args.model_dir) / "config.json").read_text())["vocab_size"])
    batches = [workloads.tiny_groups(rng, 8, 8, max_len=512, vocab=vocab) for _ in range(args.steps + 1)]
    lora = _lora_settings(args)
    cfg = LearnerConfig(
        groups_per_step=8, micro_batch_tokens=4096, max_staleness=0, total_steps=100, lora=lora
    )
    world = init_distributed("cpu")
    baseline = _rss_bytes()
    try:
        learner = Learner(cfg, args.model_dir, world, model_dtype=args.dtype)
        learner.train_step(batches[0])  # warm-up
        seconds, tokens = 0.0, 0
        for i, groups in enumerate(batches[1:], start=1):
            for group in groups:  # each batch at the learner's version: staleness 0
                for t in group.trajectories:
                    t.versions[t.versions >= 0] = i
            start = time.perf_counter()
            learner.train_step(groups)
            seconds += time.perf_counter() - start
            tokens += workloads.batch_tokens(groups)
        state = _state_bytes(learner.model, learner.optimizer)
    finally:
        shutdown_distributed()
    peak = _peak_rss_since(baseline)
    return {
        "tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "tokens": tokens,
        "peak_rss": peak,
        "peft_import": peft_import,
    } | {f"state/{k}": v for k, v in state.items()}


def run(args) -> dict:
    """Both modes, each in a child process, one after the other; the ratios LoRA / full."""
    with tempfile.TemporaryDirectory(prefix="sr1-bench-lora-") as tmp:
        model_dir = args.model or build_model(Path(tmp))
        if not (Path(model_dir) / "config.json").is_file():
            raise SystemExit(f"--model {model_dir}: no config.json there (a Hugging Face model directory)")
        result: dict = {"rank": args.rank, "dtype": args.dtype, "steps": args.steps, "threads": args.threads}
        for mode in MODES:
            command = [sys.executable, __file__, "--child", mode, "--model-dir", model_dir]
            command += ["--steps", str(args.steps), "--rank", str(args.rank), "--dtype", args.dtype]
            command += ["--threads", str(args.threads)] + (["--plain"] if args.plain else [])
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"the {mode} child failed ({done.returncode}):\n{done.stderr[-3000:]}")
            result[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    full, lora = result["full"], result["lora"]
    training = ("state/parameters", "state/gradients", "state/optimizer")
    result["ratio_tokens_per_s"] = lora["tokens_per_s"] / full["tokens_per_s"]
    result["ratio_peak_rss"] = lora["peak_rss"] / full["peak_rss"]
    result["ratio_training_state"] = sum(lora[k] for k in training) / sum(full[k] for k in training)
    return result


def print_table(result: dict) -> None:
    mib = 2**20
    print(
        f"LoRA rank {result['rank']} vs full weights, model.dtype {result['dtype']}, {result['steps']} timed steps"
    )
    print(
        f"{'mode':<6} {'tokens/s':>10} {'trained params':>15} {'params MiB':>11} {'grads MiB':>10} "
        f"{'AdamW MiB':>10} {'peak RSS MiB':>13}"
    )
    for mode in MODES:
        r = result[mode]
        print(
            f"{mode:<6} {r['tokens_per_s']:>10.0f} {r['state/trained_parameters']:>15,} "
            f"{r['state/parameters'] / mib:>11.1f} {r['state/gradients'] / mib:>10.1f} "
            f"{r['state/optimizer'] / mib:>10.1f} {r['peak_rss'] / mib:>13.1f}"
        )
    print(
        f"LoRA / full: tokens/s {result['ratio_tokens_per_s']:.2f}x, training state "
        f"{result['ratio_training_state']:.3f}x, peak RSS {result['ratio_peak_rss']:.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.child:
        print(json.dumps(plain_child(args) if args.plain else child(args)))
        return 0
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
