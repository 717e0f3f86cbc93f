"""Learner throughput, measured as the trainer runs it: packing against padding, and against a plain PyTorch step.

    python scripts/bench_learner.py [--quick] [--json] [--device cpu|cuda] [--model DIR]
    python scripts/bench_learner.py --device cuda --shape qwen2.5-0.5b|qwen2.5-1.5b|qwen2.5-3b [--budget 16384]
    python scripts/bench_learner.py --logprob-memory [--tokens 2048,4096,16384] [--chunk-tokens 1024] [--json]

One process, world size 1, three steps on the same variable-length batches (search-trajectory lengths: short
prompts, heavy-tailed responses), each timed from the host with the device synchronised:
- packed: `Learner.train_step` itself (learner/trainer.py): the model in train mode (gradient checkpointing as
  configured), GRPO + `tis`, first-fit-decreasing packed micro-batches of `--budget` tokens, the attention the
  learner picks (learner/attention.py), the chunked log-prob head, foreach clipping, fused AdamW.
- padded: the same learner's model, optimizer, clipping and loss on padded micro-batches (rows x longest <= budget).
- plain (`--reference`, default on CUDA): a plain PyTorch step on the same weights, about the same tokens per update
  (no FSDP, autocast bf16, SDPA causal on dense rows); it runs first and frees its memory before the learner loads.
The padded and plain steps: scripts/learner_baselines.py.
Throughput counts real tokens only. MFU = 6 x parameters x tokens/s / `--peak-flops` (989e12, H100 SXM dense bf16,
by default on CUDA; recomputation not counted). Peak GiB is torch's allocator high-water mark per step (CUDA).
Without --model or --shape a small random Qwen2 (hidden 256, 4 layers) is built in a temporary directory;
`--shape` builds a random-init Qwen2.5 of that shape (real 151,936-token vocabulary, no download).
`--profile N` prints the top N ops of a torch.profiler trace of one packed step.

--logprob-memory: the log-prob step (forward, policy loss, backward of one packed micro-batch; no optimizer step) at
Qwen's 151,936-token vocabulary on a tiny Qwen2 body, so the LM head dominates. The chunked head
(learner/chunked_logprobs.py) against the unchunked code it replaced, kept below as `_unchunked_token_logprobs`;
both are called as the trainer calls them (entropy for the metric, entropy_coef 0, unless --entropy). Each run is
a fresh process (CPU only): its peak RSS (the kernel's high-water mark, reset after the model is loaded) minus the
RSS after loading is the step's peak memory; parameter gradients count in both. The unchunked path runs only at
sizes whose ~5.5 [tokens x vocab] fp32 copies fit in the available memory; runs alternate A-B-B-A.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from learner_baselines import CHECKPOINTED_SHAPES, QWEN_VOCAB, SHAPES, padded_micro_batches, padded_step  # noqa: E402

from learner.attention import IMPLEMENTATIONS  # noqa: E402

H100_BF16_FLOPS = 989e12


def _lengths(rng, n: int, max_len: int) -> list[tuple[int, int]]:
    """(prompt, response) lengths shaped like search trajectories: short prompts, heavy-tailed responses."""
    out = []
    for _ in range(n):
        prompt = int(rng.integers(32, 128))
        response = int(min(max_len - prompt, max(16, rng.lognormal(5.0, 0.8))))
        out.append((prompt, response))
    return out


def _groups(rng, n_groups: int, group_size: int, max_len: int, vocab: int):
    from buffer.records import Group
    from tests.fakes.groups import random_trajectory

    groups = []
    for g in range(n_groups):
        trajectories = [
            random_trajectory(
                rng, prompt_len=p, response_len=r, version=0, vocab_size=vocab, reward=float(i % 2)
            )
            for i, (p, r) in enumerate(_lengths(rng, group_size, max_len))
        ]
        groups.append(Group(f"bench/train/{g}/e0", "bench", g, trajectories))
    return groups


def _bench_model(args, out_dir: Path, device) -> Path:
    """The model the bench trains: a Qwen2.5 shape (`--shape`) or the small random Qwen2."""
    if args.shape:
        from learner_baselines import write_shape_model

        return write_shape_model(args.shape, out_dir, device=device.type)
    from world.model import build_model, train_tokenizer

    texts = [f"alpha bravo {i} charlie delta echo {i * 7}" for i in range(300)]
    train_tokenizer(texts, out_dir, vocab_size=1024)
    return build_model(
        out_dir,
        out_dir,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=768,
        max_positions=args.max_len + 8,
    )


class _Timer:
    """Seconds, real tokens and the allocator's peak of each timed step of one mode."""

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

    def figures(self, name: str, parameters: int, peak_flops: float | None) -> dict:
        tokens_per_s = self.tokens / self.seconds
        out = {f"{name}/tokens_per_s": tokens_per_s}
        if peak_flops:
            out[f"{name}/mfu"] = 6 * parameters * tokens_per_s / peak_flops
        if self.device.type == "cuda":
            out[f"{name}/peak_gib"] = self.peak / 2**30
        return out


def _versions(device) -> dict:
    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def _plain_step(args, model_dir, device, step_tokens: float) -> tuple[dict, int]:
    """The plain PyTorch step (scripts/learner_baselines.py), alone on the device; freed before the learner is built."""
    from learner_baselines import PlainStep

    plain = PlainStep(
        model_dir,
        device,
        checkpointing=args.checkpointing,
        bf16=args.dtype == "bfloat16",
        chunk_tokens=args.chunk_tokens,
    )
    row_len = min(args.reference_row, args.budget)
    rows = max(1, args.budget // row_len)
    micro_batches = max(1, round(step_tokens / (rows * row_len)))  # about the learner's tokens per update
    plain.step(rows, row_len, micro_batches)  # warm-up
    timer = _Timer(device)
    for i in range(args.steps):
        timer(
            lambda i=i: plain.step(rows, row_len, micro_batches, seed=i + 1), rows * row_len * micro_batches
        )
    parameters = plain.parameters
    plain.close()
    figures = timer.figures("plain", parameters, args.peak_flops)
    figures["plain/shape"] = f"{micro_batches} x {rows} rows x {row_len} tokens per step"
    return figures, parameters


def run(args) -> dict:
    import numpy as np
    from transformers import AutoConfig

    from learner.distributed import init_distributed, shutdown_distributed
    from learner.settings import LearnerConfig
    from learner.trainer import Learner

    world = init_distributed(args.device)
    device = world.device
    tmp = tempfile.TemporaryDirectory()
    model_dir = args.model or _bench_model(args, Path(tmp.name), device)
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    rng = np.random.default_rng(0)
    batches = [_groups(rng, args.groups, args.group_size, args.max_len, vocab) for _ in range(args.steps + 1)]
    tokens = [
        sum(len(t.prompt_ids) + len(t.response_ids) for g in b for t in g.trajectories) for b in batches
    ]
    result = {"device": str(device), **_versions(device), "shape": args.shape or args.model or "small Qwen2"}

    # 1. the plain PyTorch step, alone on the device
    plain = {}
    if args.reference:
        plain, _ = _plain_step(args, model_dir, device, float(np.mean(tokens[1:])))

    # 2. the learner: its own step on packed micro-batches, and its model, optimizer and loss on padded ones
    cfg = LearnerConfig(
        groups_per_step=args.groups,
        micro_batch_tokens=args.budget,
        lr=1e-5,
        max_staleness=10**9,
        gradient_checkpointing=args.checkpointing,
        cpu_offload=args.cpu_offload,
        logprob_chunk_tokens=args.chunk_tokens,
    )
    learner = Learner(cfg, model_dir, world, model_dtype=args.dtype, attention=args.attention)
    assert learner.model.training, "the learner trains in train mode (checkpointing is off in eval mode)"
    parameters = sum(p.numel() for p in learner.model.parameters())
    steps = {
        "packed": lambda groups: learner.train_step(groups),
        "padded": lambda groups: padded_step(learner, groups, args.budget),
    }
    # Warm-up: each mode runs every batch once untimed, so that compilation (FlexAttention on CUDA compiles once per
    # new shape regime: a first shape, then dynamic shapes, then each mask type) stays out of the timed steps. Then
    # the two modes interleave step by step (alternating which goes first) so that load from other processes on a
    # shared machine hits both alike.
    for mode in ("padded", "packed"):
        for groups in batches:
            steps[mode](groups)
    timers = {mode: _Timer(device) for mode in steps}
    for i, groups in enumerate(batches[1:]):
        for mode in ("padded", "packed") if i % 2 == 0 else ("packed", "padded"):
            timers[mode](lambda mode=mode, groups=groups: steps[mode](groups), tokens[i + 1])
    if args.profile:
        _profile(lambda: learner.train_step(batches[1]), device, args.profile)
    shutdown_distributed()
    tmp.cleanup()

    from learner.packing import sequences_from_groups

    sequences = sequences_from_groups(batches[1], [np.zeros(len(g.trajectories)) for g in batches[1]])
    computed = sum(len(b) * max(len(s) for s in b) for b in padded_micro_batches(sequences, args.budget))
    result |= {
        "parameters": parameters,
        "dtype": args.dtype,
        "attention": learner.model.config._attn_implementation,
        "gradient_checkpointing": args.checkpointing,
        "cpu_offload": args.cpu_offload,
        "steps": args.steps,
        "groups_per_step": args.groups,
        "group_size": args.group_size,
        "micro_batch_tokens": args.budget,
        "max_len": args.max_len,
        "mean_seq_len": tokens[1] / (args.groups * args.group_size),
        "padded/pad_fraction": 1 - tokens[1] / computed,
        **timers["packed"].figures("packed", parameters, args.peak_flops),
        **timers["padded"].figures("padded", parameters, args.peak_flops),
        **plain,
    }
    result["ratio_packed_over_padded"] = result["packed/tokens_per_s"] / result["padded/tokens_per_s"]
    if plain:
        result["ratio_packed_over_plain"] = result["packed/tokens_per_s"] / result["plain/tokens_per_s"]
    return result


def _profile(step, device, rows: int) -> None:
    """One step under torch.profiler; its top ops by device (or CPU) time to stderr."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as trace:
        step()
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(trace.key_averages().table(sort_by=sort, row_limit=rows), file=sys.stderr)


# -- the log-prob step's peak memory (--logprob-memory) ------------------------------------------------------------

# fp32 [tokens x vocab] copies the unchunked step holds at its peak (logits, logits / T, probs, their product, the
# backward's gradient; 5.2 measured here): a size runs only when these and HEADROOM_GIB fit in the available memory
UNCHUNKED_COPIES = 5.5
HEADROOM_GIB = 1.5


def _unchunked_token_logprobs(model, mb, temperature: float, with_entropy: bool = True):
    """The trainer's log-probs before the chunked head (the baseline): fp32 logits at every kept position, then
    logsumexp and gather, and softmax for the entropy, all under autograd."""
    import torch

    from learner.packing import attention_kwargs

    out = model(
        input_ids=mb.input_ids,
        position_ids=mb.position_ids,
        logits_to_keep=mb.keep,
        use_cache=False,
        **attention_kwargs(model, mb),
    )
    logits = out.logits[0].float() / temperature
    log_norm = torch.logsumexp(logits, dim=-1)
    targets = mb.target_ids[mb.keep]
    logprobs = logits.gather(-1, targets[:, None])[:, 0] - log_norm
    entropy = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        entropy = log_norm - (probs * logits).sum(-1)
    return logprobs, entropy


def _proc_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _available_bytes(device) -> int:
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def _vocab_model(out_dir: Path, vocab: int, hidden: int, layers: int, max_len: int) -> Path:
    """A random Qwen2 with the given vocabulary and a tiny body (untied head, as in Qwen2.5-7B and larger)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=max_len,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out_dir)
    return out_dir


def _packed_micro_batch(tokens: int, seq_len: int, vocab: int):
    """One packed row of `tokens` tokens: sequences of `seq_len` (32 prompt tokens), every response token a loss
    token, behaviour log-probs near a uniform policy's."""
    import numpy as np

    from learner.packing import Sequence, pack

    rng = np.random.default_rng(0)
    sequences = []
    for i, start in enumerate(range(0, tokens, seq_len)):
        n = min(seq_len, tokens - start)
        prompt = min(32, n - 1)
        response = n - prompt
        sequences.append(
            Sequence(
                token_ids=rng.integers(0, vocab, n),
                prompt_len=prompt,
                loss_mask=np.ones(response, dtype=np.uint8),
                behavior_logprobs=(-np.log(vocab) + 0.1 * rng.standard_normal(response)).astype(np.float32),
                versions=np.zeros(response, dtype=np.int32),
                advantage=1.0 if i % 2 == 0 else -1.0,
            )
        )
    return pack(sequences)


def _logprob_worker(spec: dict) -> dict:
    """One path at one size in this (fresh) process: peak memory and seconds of the log-prob step."""
    import torch

    from learner.algorithms import build_algorithm
    from learner.algorithms.settings import GRPOConfig, TISCorrection
    from learner.distributed import init_distributed, shutdown_distributed
    from learner.model import load_policy
    from learner.packing import token_logprobs

    torch.set_num_threads(spec["threads"])
    if spec["device"] == "cpu":
        with open("/proc/self/oom_score_adj", "w") as oom:
            oom.write("1000")  # if memory runs out, the kernel kills this run first, not a neighbour
    world = init_distributed(spec["device"])
    device = world.device
    model = load_policy(spec["model"], world)
    algorithm = build_algorithm(
        GRPOConfig(entropy_coef=0.01 if spec["entropy"] == "grad" else 0.0), TISCorrection()
    )
    mb = _packed_micro_batch(spec["tokens"], spec["seq_len"], model.config.vocab_size).to(device)
    keep = mb.keep
    with_entropy = spec["entropy"] != "off"

    def step() -> None:
        if spec["path"] == "unchunked":
            logprobs, entropy = _unchunked_token_logprobs(model, mb, 1.0, with_entropy)
        else:
            logprobs, entropy = token_logprobs(
                model, mb, 1.0, with_entropy, chunk_tokens=spec["chunk_tokens"]
            )
        if entropy is not None and not algorithm.needs_entropy:
            entropy = entropy.detach()  # as the trainer does: the entropy only feeds the metric
        loss_mask = mb.loss_mask[keep]
        per_token, _ = algorithm.loss(
            logprobs,
            mb.behavior_logprobs[keep],
            mb.advantages[keep],
            loss_mask,
            torch.zeros_like(keep),
            entropy=entropy,
        )
        per_token.sum().backward()
        model.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        base = _proc_kib("VmRSS") * 1024
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # reset the peak RSS (VmHWM) to the current RSS: loading's peak does not count
    step()  # warm-up (allocations, lazy init); its peak counts
    seconds = []
    for _ in range(spec["steps"]):
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = _proc_kib("VmHWM") * 1024 - base
    shutdown_distributed()
    kept = int(keep.numel())
    return {"peak_bytes": peak, "seconds": seconds, "kept_tokens": kept, "tokens_per_s": kept / min(seconds)}


def _run_worker(spec: dict) -> dict:
    import subprocess

    cmd = [sys.executable, str(Path(__file__).resolve()), "--logprob-worker", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == -9:
        raise RuntimeError(f"{spec['path']} at {spec['tokens']} tokens was killed (out of memory?)")
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['path']} at {spec['tokens']} tokens failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def logprob_memory(args) -> dict:
    """Each size: the chunked path, and the unchunked one where it fits, `--repeats` times each (A-B-B-A)."""
    import torch
    from rich.console import Console

    console = Console(stderr=True)
    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    tmp = tempfile.TemporaryDirectory()
    model_dir = str(_vocab_model(Path(tmp.name), args.vocab, args.hidden, args.layers, args.seq_len + 8))
    rows = []
    for tokens in args.tokens:
        paths = ["chunked"]
        needed = UNCHUNKED_COPIES * tokens * args.vocab * 4 + HEADROOM_GIB * 2**30
        if needed <= _available_bytes(device):
            paths = ["unchunked", "chunked"]
        else:
            console.print(
                f"{tokens} tokens: unchunked skipped (~{needed / 2**30:.1f} GiB > available memory)"
            )
        runs: dict[str, list[dict]] = {path: [] for path in paths}
        for repeat in range(args.repeats):
            for path in paths if repeat % 2 == 0 else paths[::-1]:
                spec = {
                    "path": path,
                    "tokens": tokens,
                    "model": model_dir,
                    "device": args.device,
                    "threads": args.threads,
                    "steps": args.steps,
                    "entropy": args.entropy,
                    "chunk_tokens": args.chunk_tokens,
                    "seq_len": args.seq_len,
                }
                result = _run_worker(spec)
                runs[path].append(result)
                console.print(
                    f"{tokens} tokens, {path} run {repeat + 1}: peak {result['peak_bytes'] / 2**30:.2f} GiB, "
                    f"{result['tokens_per_s']:.0f} tokens/s"
                )
        row = {"tokens": tokens, "kept_tokens": runs["chunked"][0]["kept_tokens"]}
        for path, results in runs.items():
            row[f"{path}/peak_gib"] = max(r["peak_bytes"] for r in results) / 2**30
            row[f"{path}/tokens_per_s"] = sum(r["tokens_per_s"] for r in results) / len(results)
        if "unchunked" in runs:
            row["peak_ratio_chunked_over_unchunked"] = row["chunked/peak_gib"] / row["unchunked/peak_gib"]
            row["speed_ratio_chunked_over_unchunked"] = (
                row["chunked/tokens_per_s"] / row["unchunked/tokens_per_s"]
            )
        rows.append(row)
    tmp.cleanup()
    return {
        "device": args.device,
        "vocab": args.vocab,
        "body": f"Qwen2, hidden {args.hidden}, {args.layers} layers, fp32",
        "sequence_len": args.seq_len,
        "chunk_tokens": args.chunk_tokens,
        "entropy": args.entropy,
        "threads": args.threads,
        "steps": args.steps,
        "repeats": args.repeats,
        "sizes": rows,
    }


_TABLE_CELLS = [
    ("unchunked/peak_gib", ".2f"),
    ("chunked/peak_gib", ".2f"),
    ("peak_ratio_chunked_over_unchunked", ".3f"),
    ("unchunked/tokens_per_s", ".0f"),
    ("chunked/tokens_per_s", ".0f"),
    ("speed_ratio_chunked_over_unchunked", ".2f"),
]


def _print_logprob_memory(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"log-prob step at vocab {result['vocab']} ({result['body']}, chunk {result['chunk_tokens']}, "
        f"entropy {result['entropy']}, {result['threads']} threads)"
    )
    for column in (
        "tokens",
        "unchunked peak GiB",
        "chunked peak GiB",
        "peak ratio",
        "unchunked tok/s",
        "chunked tok/s",
        "speed ratio",
    ):
        table.add_column(column, justify="right")
    for row in result["sizes"]:
        cells = {key: format(row[key], fmt) if key in row else "-" for key, fmt in _TABLE_CELLS}
        table.add_row(str(row["tokens"]), *cells.values())
    Console().print(table)


def measure(argv: list[str] | None = None) -> tuple[dict, bool]:
    """Parse the options, run both modes, return (figures, --json given). Also used by bench_weight_sync.py."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (fewer, smaller steps)")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--model", default=None, help="HF model directory (default: a small random Qwen2)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="compute dtype")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per mode")
    parser.add_argument("--groups", type=int, default=None, help="groups per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--budget", type=int, default=None, help="micro_batch_tokens")
    parser.add_argument("--max-len", type=int, default=1024, help="longest prompt + response")
    parser.add_argument(
        "--shape",
        default=None,
        choices=list(SHAPES),
        help="a random-init Qwen2.5 of this shape (default --budget 16384, --groups 8)",
    )
    parser.add_argument(
        "--attention",
        default="auto",
        choices=["auto", *IMPLEMENTATIONS],
        help="the learner's attention for packed rows (learner/attention.py; auto: by device)",
    )
    parser.add_argument(
        "--checkpointing",
        default=None,
        action=argparse.BooleanOptionalAction,
        help="gradient checkpointing (default: on for the 1.5B and 3B shapes)",
    )
    parser.add_argument("--cpu-offload", action="store_true", help="learner.cpu_offload")
    parser.add_argument(
        "--reference",
        default=None,
        action=argparse.BooleanOptionalAction,
        help="run the plain PyTorch step too (default: on CUDA)",
    )
    parser.add_argument(
        "--reference-row", type=int, default=2048, help="tokens per dense row of the plain step"
    )
    parser.add_argument(
        "--peak-flops",
        type=float,
        default=None,
        help=f"peak FLOP/s for MFU (default on CUDA: {H100_BF16_FLOPS:.0e}, H100 SXM dense bf16)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="print the top N ops of one profiled packed step (stderr)",
    )
    memory = parser.add_argument_group(
        "--logprob-memory: the log-prob step's peak memory at a large vocabulary"
    )
    memory.add_argument("--logprob-memory", action="store_true", help="measure the log-prob step (see above)")
    memory.add_argument(
        "--tokens", default="2048,4096,16384", help="micro-batch sizes in tokens, comma-separated"
    )
    memory.add_argument(
        "--chunk-tokens", type=int, default=1024, help="learner.logprob_chunk_tokens (both modes)"
    )
    memory.add_argument("--vocab", type=int, default=QWEN_VOCAB, help="vocabulary size (Qwen2.5: 151,936)")
    memory.add_argument("--hidden", type=int, default=128, help="hidden size of the tiny body")
    memory.add_argument("--layers", type=int, default=2, help="decoder layers of the tiny body")
    memory.add_argument("--seq-len", type=int, default=1024, help="tokens per packed sequence")
    memory.add_argument(
        "--entropy",
        default="metric",
        choices=["off", "metric", "grad"],
        help="off: log-probs only; metric: entropy without gradient (entropy_coef 0, the default); "
        "grad: entropy in the loss",
    )
    memory.add_argument("--threads", type=int, default=1, help="torch threads per run (CPU)")
    memory.add_argument("--repeats", type=int, default=2, help="runs per path and size (A-B-B-A order)")
    args = parser.parse_args(argv)
    import torch

    if args.logprob_memory:
        args.device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
        args.device = "cpu" if args.device == "auto" else args.device
        args.steps = args.steps or (1 if args.quick else 2)
        args.tokens = [int(t) for t in args.tokens.split(",")]
        return logprob_memory(args), args.json

    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    args.device = "cuda" if cuda else "cpu"
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.steps = args.steps or (2 if args.quick else 5)
    args.groups = args.groups or (2 if args.quick else 8 if args.shape else 4)
    args.budget = args.budget or (16384 if args.shape else 4096)
    if args.checkpointing is None:
        args.checkpointing = args.shape in CHECKPOINTED_SHAPES
    if args.reference is None:
        args.reference = cuda
    if args.peak_flops is None and cuda:
        args.peak_flops = H100_BF16_FLOPS
    if args.budget < args.max_len:
        parser.error(f"--budget ({args.budget}) must be >= --max-len ({args.max_len})")
    return run(args), args.json


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--logprob-worker"]:  # one run of --logprob-memory, in its own process
        print(json.dumps(_logprob_worker(json.loads(argv[1]))))
        return 0
    result, as_json = measure(argv)
    if as_json:
        print(json.dumps(result))
    elif "sizes" in result:
        _print_logprob_memory(result)
    else:
        for key, value in result.items():
            print(f"{key:28s} {value:.3f}" if isinstance(value, float) else f"{key:28s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
