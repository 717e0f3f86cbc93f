"""The log-prob step's peak memory at a large vocabulary, the chunked LM head against the unchunked one.

    python scripts/bench/logprob_memory.py [--tokens 2048,4096,16384] [--chunk-tokens 1024] [--json]
    python scripts/bench/bench_learner.py --logprob-memory [...]        # the same

The log-prob step (forward, policy loss, backward of one packed micro-batch; no optimizer step) at Qwen's
151,936-token vocabulary on a tiny Qwen2 body, so the LM head dominates. The chunked head
(learner/execution/chunked_logprobs.py) against the unchunked code it replaced, kept below as
`_unchunked_token_logprobs`; both are called as the trainer calls them (entropy for the metric, entropy_coef 0, unless
--entropy). Each run is a fresh process (CPU only): its peak RSS (the kernel's high-water mark, reset after the model
is loaded) minus the RSS after loading is the step's peak memory; parameter gradients count in both. The unchunked
path runs only at sizes whose ~5.5 [tokens x vocab] fp32 copies fit in the available memory; runs alternate A-B-B-A.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.bench.learner_baselines import QWEN_VOCAB  # noqa: E402

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

    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == -9:
        raise RuntimeError(f"{spec['path']} at {spec['tokens']} tokens was killed (out of memory?)")
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['path']} at {spec['tokens']} tokens failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(args) -> dict:
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


def print_table(result: dict) -> None:
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


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options (`--logprob-memory` is accepted: `bench_learner.py --logprob-memory ...` hands its arguments here)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logprob-memory", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure")
    parser.add_argument("--json-out", default=None, metavar="FILE", help="also write the JSON object to FILE")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="one timed step per run")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default 2)")
    parser.add_argument(
        "--tokens", default="2048,4096,16384", help="micro-batch sizes in tokens, comma-separated"
    )
    parser.add_argument(
        "--chunk-tokens", type=int, default=1024, help="learner.logprob_chunk_tokens (both paths)"
    )
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB, help="vocabulary size (Qwen2.5: 151,936)")
    parser.add_argument("--hidden", type=int, default=128, help="hidden size of the tiny body")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the tiny body")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per packed sequence")
    parser.add_argument(
        "--entropy",
        default="metric",
        choices=["off", "metric", "grad"],
        help="off: log-probs only; metric: entropy without gradient (entropy_coef 0, the default); "
        "grad: entropy in the loss",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (CPU)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per path and size (A-B-B-A order)")
    args = parser.parse_args(argv)
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.steps = args.steps or (1 if args.quick else 2)
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens must be comma-separated integers, got {args.tokens!r}")
    args.logprob_memory = True
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # one run, in its own process
        print(json.dumps(_logprob_worker(json.loads(argv[1]))))
        return 0
    args = parse(argv)
    result = measure(args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
