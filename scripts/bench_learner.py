"""Learner throughput: sequence packing against padding on variable-length groups, measured in one run.

    python scripts/bench_learner.py [--quick] [--json] [--device cpu|cuda] [--model DIR]

Both paths run the same FSDP2 policy (world size 1), the same loss (GRPO + `tis`) and the same token budget per
micro-batch. Packing: first-fit-decreasing rows with a block-causal mask (flash-attention varlen on GPU when
installed). Padding: sequences in arrival order, each micro-batch padded to its longest sequence (rows x longest
<= budget), a 2-D padding mask. Throughput counts real tokens only; the ratio is packed / padded tokens per second.
Without --model a small random Qwen2 (hidden 256, 4 layers) is built in a temporary directory.
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")


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


def _padded_micro_batches(sequences, budget: int):
    """Arrival order, rows x longest <= budget (the usual padded data loader)."""
    batches, current = [], []
    for s in sequences:
        longest = max([len(x) for x in current] + [len(s)])
        if current and (len(current) + 1) * longest > budget:
            batches.append(current)
            current = []
        current.append(s)
    if current:
        batches.append(current)
    return batches


def _padded_loss(model, seqs, algorithm, temperature: float, device):
    """Loss over a padded micro-batch: the same targets and loss as the packed path."""
    import torch

    longest = max(len(s) for s in seqs)
    n = len(seqs)
    ids = torch.zeros(n, longest, dtype=torch.long)
    mask = torch.zeros(n, longest, dtype=torch.long)
    target = torch.zeros(n, longest, dtype=torch.long)
    has_target = torch.zeros(n, longest, dtype=torch.bool)
    loss_mask = torch.zeros(n, longest)
    behavior = torch.zeros(n, longest)
    adv = torch.zeros(n, longest)
    for i, s in enumerate(seqs):
        L, p = len(s), s.prompt_len
        ids[i, :L] = torch.from_numpy(s.token_ids)
        mask[i, :L] = 1
        target[i, p - 1 : L - 1] = torch.from_numpy(s.token_ids[p:])
        has_target[i, p - 1 : L - 1] = True
        loss_mask[i, p - 1 : L - 1] = torch.from_numpy(s.loss_mask.astype("float32"))
        behavior[i, p - 1 : L - 1] = torch.from_numpy(s.behavior_logprobs)
        adv[i, p - 1 : L - 1] = s.advantage
    ids, mask = ids.to(device), mask.to(device)
    # the LM head only where some row has a target (the packed path does the same with its `keep` positions)
    columns = has_target.any(0).nonzero()[:, 0]
    out = model(input_ids=ids, attention_mask=mask, logits_to_keep=columns.to(device), use_cache=False)
    sel = has_target[:, columns].to(device)
    logits = out.logits[sel].float() / temperature
    tgt = target[:, columns].to(device)[sel]
    logprobs = logits.gather(-1, tgt[:, None])[:, 0] - torch.logsumexp(logits, -1)
    target, loss_mask, behavior, adv = (x[:, columns] for x in (target, loss_mask, behavior, adv))
    lm = loss_mask.to(device)[sel]
    per_token, _ = algorithm.loss(
        logprobs, behavior.to(device)[sel], adv.to(device)[sel], lm, torch.zeros_like(lm)
    )
    return per_token.sum(), int(sum(len(s) for s in seqs)), n * longest


def _packed_loss(model, mb, algorithm, temperature: float):
    import torch

    from learner.packing import token_logprobs

    logprobs, _ = token_logprobs(model, mb, temperature, with_entropy=False)
    keep = mb.keep
    lm = mb.loss_mask[keep]
    per_token, _ = algorithm.loss(
        logprobs, mb.behavior_logprobs[keep], mb.advantages[keep], lm, torch.zeros_like(lm)
    )
    return per_token.sum(), mb.num_tokens, mb.num_tokens


def run(args) -> dict:
    import numpy as np
    import torch

    from learner.algorithms import build_algorithm
    from learner.distributed import init_distributed, shutdown_distributed
    from learner.model import build_optimizer, load_policy
    from learner.packing import pack_micro_batches, sequences_from_groups
    from learner.settings import LearnerConfig

    world = init_distributed(args.device)
    device = world.device
    tmp = None
    model_dir = args.model
    if model_dir is None:
        from sr1.world.model import build_model, train_tokenizer

        tmp = tempfile.TemporaryDirectory()
        texts = [f"alpha bravo {i} charlie delta echo {i * 7}" for i in range(300)]
        train_tokenizer(texts, Path(tmp.name), vocab_size=1024)
        model_dir = build_model(
            Path(tmp.name), Path(tmp.name), hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
            intermediate_size=768, max_positions=args.max_len + 8,
        )  # fmt: skip
    cfg = LearnerConfig(groups_per_step=args.groups, micro_batch_tokens=args.budget, lr=1e-5)
    model = load_policy(model_dir, world, dtype=args.dtype)
    optimizer, _ = build_optimizer(model, cfg)
    algorithm = build_algorithm(cfg.algorithm, cfg.correction)  # GRPO with tis, the defaults
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    batches = [_groups(rng, args.groups, args.group_size, args.max_len, vocab) for _ in range(args.steps + 1)]

    def step(groups, mode: str) -> tuple[int, int, float]:
        adv = algorithm.advantages(groups).advantages
        seqs = sequences_from_groups(groups, adv)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        if mode == "packed":
            micro = [mb.to(device) for mb in pack_micro_batches(seqs, args.budget)]
        else:
            micro = _padded_micro_batches(seqs, args.budget)
        total = sum(int(s.loss_mask.sum()) for s in seqs)
        real = computed = 0
        for mb in micro:
            if mode == "packed":
                loss, r, c = _packed_loss(model, mb, algorithm, 1.0)
            else:
                loss, r, c = _padded_loss(model, mb, algorithm, 1.0, device)
            (loss / max(total, 1)).backward()
            real, computed = real + r, computed + c
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return real, computed, time.perf_counter() - start

    # Interleave the two modes step by step (alternating which goes first) so that load from other processes on a
    # shared machine hits both alike; each mode warms up once first.
    step(batches[0], "padded")
    step(batches[0], "packed")
    results = {mode: {"seconds": 0.0, "real_tokens": 0, "computed": 0} for mode in ("padded", "packed")}
    for i, groups in enumerate(batches[1:]):
        for mode in ("padded", "packed") if i % 2 == 0 else ("packed", "padded"):
            r, c, sec = step(groups, mode)
            results[mode]["seconds"] += sec
            results[mode]["real_tokens"] += r
            results[mode]["computed"] += c
    for mode in results:
        results[mode]["tokens_per_s"] = results[mode]["real_tokens"] / results[mode]["seconds"]
    shutdown_distributed()
    if tmp is not None:
        tmp.cleanup()
    seqs_total = sum(len(t.prompt_ids) + len(t.response_ids) for g in batches[1] for t in g.trajectories)
    return {
        "device": str(device),
        "steps": args.steps,
        "groups_per_step": args.groups,
        "group_size": args.group_size,
        "micro_batch_tokens": args.budget,
        "max_len": args.max_len,
        "mean_seq_len": seqs_total / (args.groups * args.group_size),
        "padded/tokens_per_s": results["padded"]["tokens_per_s"],
        "padded/pad_fraction": 1 - results["padded"]["real_tokens"] / results["padded"]["computed"],
        "packed/tokens_per_s": results["packed"]["tokens_per_s"],
        "ratio_packed_over_padded": results["packed"]["tokens_per_s"] / results["padded"]["tokens_per_s"],
    }


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
    args = parser.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.steps = args.steps or (2 if args.quick else 5)
    args.groups = args.groups or (2 if args.quick else 4)
    args.budget = args.budget or 4096
    if args.budget < args.max_len:
        parser.error(f"--budget ({args.budget}) must be >= --max-len ({args.max_len})")
    return run(args), args.json


def main(argv: list[str] | None = None) -> int:
    result, as_json = measure(argv)
    if as_json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value:.3f}" if isinstance(value, float) else f"{key:28s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
