"""Benchmark: tokens/s of the full search agent loop against raw engine generation of the same tokens, one run.

    python scripts/bench/bench_generators.py                    # tiny world (warm-started policy, BM25 over its corpus)
    python scripts/bench/bench_generators.py --quick --json     # short run, one JSON object with every figure
    python scripts/bench/bench_generators.py --model DIR --corpus corpus.jsonl --prompts train.parquet
    python scripts/bench/bench_generators.py --identity-layers 14  # same samples, a forward 8x as costly
    python scripts/bench/bench_generators.py --curve 8,32,128 --json > engine.json   # the engine's tokens/s curve
    python scripts/bench/bench_generators.py --null-engine      # one worker's ceiling: 64-512 sequences, one core

Both phases run the way a generator worker does, continuously: `--total-groups` prompts go through the engine
with at most `--groups` groups (x `--group-size` trajectories) in flight, a new one starting as soon as one ends, so
the engine stays full and the figure is a throughput, not the latency of one wave. Phase "agent": each group runs
through the agent loop (multi-turn, stop strings, per-token log-probs and versions, observations from an in-process
BM25 retriever). Phase "raw": the same engine generates, for each trajectory, exactly as many tokens as that
trajectory sampled, from the same prompt, in one request each (no stop strings, EOS ignored, no log-probs, final
output only), with at most as many requests in flight as trajectories were: the engine's own speed on the same
work. The ratio agent / raw is the share of raw generation speed the agent loop keeps (target >= 0.8). A
third figure, "wrapper", is the raw work through the `Engine` wrapper (streamed outputs + log-probs), and a fourth,
"replay", is the agent's own engine work without the agent loop: each trajectory's turns as separate requests with
its observation tokens appended between them (the same prefills and prefix-cache hits). Together they split the gap:
replay / raw is what multi-turn costs the engine itself, agent / replay what the loop (stop strings, log-probs,
search, parsing) adds. The prefix cache is reset between phases.

`--curve N1,N2,...` measures something else: the engine's decode tokens/s with exactly N sequences in flight, for
each N (`sr1 plan --engine-bench FILE` reads it as the generator's `tokens_per_s` curve). At each N, waves of N
requests start together from distinct prompts (prefix cache reset) and each samples exactly `--curve-tokens` more
tokens in a long wave than in a short one; the rate is N x that difference over the difference of the waves' median
times, so prefills and per-request costs cancel and what remains is decode at N sequences. `--engines K` starts K
engines on the same device and runs their waves together: the curve of one engine while K share it (on a CPU core,
what generators pinned to one core get).

`--null-engine` measures the worker instead of the engine: how many tokens/s one worker process (vLLM's front end,
the agent loop, Redis traffic) can take from an engine that costs nothing, pinned to one core, at each concurrency;
`scripts/bench/worker_ceiling.py` says how.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.bench import worker_ceiling  # noqa: E402 - the --null-engine mode
from scripts.bench.engine_baselines import bounded, curve, raw_phase, replay_phase  # noqa: E402
from scripts.bench.worker_ceiling import concurrencies  # noqa: E402


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--world", type=Path, default=Path("runs/tiny_world"), help="tiny world dir (built if absent)"
    )
    parser.add_argument("--model", type=Path, default=None, help="HF model dir (default: the tiny world's)")
    parser.add_argument("--corpus", type=Path, default=None, help="corpus JSONL (default: the tiny world's)")
    parser.add_argument(
        "--prompts", type=Path, default=None, help="parquet/JSONL prompts (default: tiny world's)"
    )
    parser.add_argument("--config", default="tiny", help="preset or YAML for the generators/model sections")
    parser.add_argument("--groups", type=int, default=16, help="groups in flight at once")
    parser.add_argument(
        "--total-groups", type=int, default=None, help="groups per phase (default 8x --groups; quick 2x)"
    )
    parser.add_argument("--group-size", type=int, default=None, help="samples per prompt (default: config)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="measure each phase this many times (best kept)"
    )
    parser.add_argument(
        "--identity-layers",
        type=int,
        default=0,
        help="add this many layers whose output projections are zero: the same samples, a costlier forward",
    )
    parser.add_argument(
        "--curve",
        default=None,
        help="measure the engine's decode tokens/s at these concurrencies instead (comma-separated, e.g. 8,32,128)",
    )
    parser.add_argument(
        "--curve-tokens", type=int, default=128, help="extra tokens a long wave samples per request (--curve)"
    )
    parser.add_argument(
        "--engines",
        type=int,
        default=1,
        help="--curve: run this many engines at once on the same device (their rates are per engine)",
    )
    parser.add_argument("--quick", action="store_true", help="a short run (4 groups, 1 repeat)")
    parser.add_argument("--json", action="store_true", help="print one JSON object with every figure")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. generators.max_turns=3")
    return parser.parse_args(argv)


def _local_search(corpus: Path, topk: int):
    """An in-process BM25 retriever as the Search-R1 task's search function."""
    from retrieval.bm25 import BM25Retriever
    from retrieval.client import SearchResult
    from retrieval.corpus import DocStore

    retriever = BM25Retriever.build(DocStore(corpus))
    retriever.warmup()

    async def search(query: str) -> SearchResult:
        hits = (await retriever.asearch([query], topk))[0]
        return SearchResult(query=query, documents=hits.docs, scores=hits.scores)

    return search


def _with_identity_layers(model_dir: Path, extra: int, out_dir: Path) -> Path:
    """A copy of the model with `extra` more decoder layers whose attention and MLP output projections are zero:
    each adds nothing to the residual stream, so the model samples exactly what the original does, while a forward
    costs what a deeper model's would (how the ratio moves when compute, not per-token overhead, dominates)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    layers = model.model.layers
    g = torch.Generator().manual_seed(0)
    for _ in range(extra):
        layer = copy.deepcopy(layers[-1])
        with torch.no_grad():
            for name, param in layer.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    param.zero_()
                elif param.dim() == 2:  # the other matrices do real (if unused) work
                    param.copy_(torch.randn(param.shape, generator=g) * 0.02)
        layers.insert(len(layers) - 1, layer)
    for index, layer in enumerate(layers):
        layer.self_attn.layer_idx = index
    model.config.num_hidden_layers = len(layers)
    model.config.layer_types = ["full_attention"] * len(layers)
    model.save_pretrained(str(out_dir))
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out_dir))
    return out_dir


async def _bench(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from config import load_config
    from generators.agent import AgentSettings
    from generators.engine import VLLMEngine
    from generators.group import run_group
    from tasks.prompt_tokens import encode_prompt
    from tasks.search_r1 import SearchR1Task
    from tasks.search_r1.data import load_prompts

    cfg = load_config(args.config, args.overrides)
    gen_cfg = cfg.generators
    group_size = args.group_size or gen_cfg.group_size
    groups = 4 if args.quick else args.groups
    total_groups = args.total_groups or groups * (2 if args.quick else 8)
    in_flight = groups * group_size
    if args.quick:
        args.repeats = 1
    model_dir, corpus, prompts_path = args.model, args.corpus, args.prompts
    if model_dir is None or corpus is None or prompts_path is None:
        from world import build_world

        world = build_world(args.world, cfg.seed, progress=not args.json)
        model_dir = model_dir or world.model_dir
        corpus = corpus or world.corpus_path
        prompts_path = prompts_path or world.train_path
    if args.identity_layers:
        model_dir = _with_identity_layers(Path(model_dir), args.identity_layers, args.scratch / "model")
    wanted = max(args.curve) if args.curve is not None else total_groups
    prompts = load_prompts(prompts_path)[:wanted]
    if args.curve is not None:
        if max(args.curve) > gen_cfg.engine.max_num_seqs:
            raise SystemExit(
                f"--curve {max(args.curve)}: the engine batches at most generators.engine.max_num_seqs = "
                f"{gen_cfg.engine.max_num_seqs} sequences (raise it with an override to measure further)"
            )
    elif len(prompts) < total_groups:
        raise SystemExit(
            f"{prompts_path} has only {len(prompts)} prompts; {total_groups} groups were asked for"
        )
    task = SearchR1Task(cfg.task, search=_local_search(Path(corpus), cfg.retrieval.topk))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    max_model_len = gen_cfg.engine.max_model_len or cfg.model.max_seq_len
    settings = AgentSettings.from_config(gen_cfg, max_model_len)
    engines = []
    try:
        # --curve --engines K: K engines on the same device, as generators sharing one would be
        for _ in range(args.engines if args.curve is not None else 1):
            engines.append(
                VLLMEngine.create(
                    str(model_dir),
                    gen_cfg.engine,
                    dtype=cfg.model.dtype,
                    max_model_len=max_model_len,
                    weight_sync=False,
                )
            )
        engine = engines[0]
        chat = cfg.model.chat_template
        if args.curve is not None:
            encoded = [encode_prompt(tokenizer, p.prompt, chat_template=chat) for p in prompts]
            points = await curve(
                engines, encoded, args.curve, args.curve_tokens, args.repeats, gen_cfg.temperature
            )
            return {
                "engine_curve": points,
                "engines_sharing_the_device": len(engines),
                "model": str(model_dir),
                "device": _device(),
                "curve_tokens": args.curve_tokens,
                "repeats": args.repeats,
                "date": time.strftime("%Y-%m-%d"),
            }
        kwargs = dict(n=group_size, chat_template=chat)
        # warm-up at full concurrency: the first batches of each size pay for lazy initialisation
        warm = [(encode_prompt(tokenizer, p.prompt, chat_template=chat), 16) for p in prompts[:groups]]
        await raw_phase(engine, warm * group_size, gen_cfg.temperature, wrapper=False, in_flight=in_flight)
        await run_group(engine, prompts[0], task, tokenizer, settings, **kwargs)

        runs: list[dict[str, float]] = []
        for _ in range(args.repeats):
            # 1. the agent loop
            await engine.llm.reset_prefix_cache()
            start = time.perf_counter()
            results = await bounded(
                [run_group(engine, p, task, tokenizer, settings, **kwargs) for p in prompts], groups
            )
            agent_s = time.perf_counter() - start
            rollouts = [r for _, rs in results for r in rs]
            requests = [(r.prompt_ids, r.sampled_tokens) for r in rollouts]
            # 2. raw engine generation of the same tokens (same prompts, same count per trajectory)
            await engine.llm.reset_prefix_cache()
            raw_s = await raw_phase(engine, requests, gen_cfg.temperature, wrapper=False, in_flight=in_flight)
            # 3. the same through the Engine wrapper (streamed outputs, log-probs, versions)
            await engine.llm.reset_prefix_cache()
            wrapper_s = await raw_phase(
                engine, requests, gen_cfg.temperature, wrapper=True, in_flight=in_flight
            )
            # 4. the agent's engine work (same turns and observations) without the agent loop
            await engine.llm.reset_prefix_cache()
            replay_s = await replay_phase(engine, rollouts, gen_cfg.temperature, in_flight)
            sampled = sum(r.sampled_tokens for r in rollouts)
            runs.append(
                {"tokens": sampled, "agent": agent_s, "raw": raw_s, "wrapper": wrapper_s, "replay": replay_s}
            )
    finally:
        for each in engines:
            each.shutdown()

    finish: dict[str, int] = {}
    for r in rollouts:
        finish[r.finish_reason] = finish.get(r.finish_reason, 0) + 1
    # best of the repeats (the machine is shared; the fastest run is the least disturbed one)
    phases = ("agent", "raw", "wrapper", "replay")
    rate = {k: [r["tokens"] / r[k] for r in runs] for k in phases}
    agent_tps, raw_tps, wrapper_tps, replay_tps = (max(rate[k]) for k in phases)
    sampled = runs[-1]["tokens"]
    observation = sum(len(r.response_ids) - r.sampled_tokens for r in rollouts)
    return {
        "model": str(model_dir),
        "groups_in_flight": groups,
        "total_groups": total_groups,
        "group_size": group_size,
        "block_size": gen_cfg.engine.block_size,
        "identity_layers": args.identity_layers,
        "trajectories": len(rollouts),
        "sampled_tokens": sampled,
        "observation_tokens": observation,
        "tool_calls": sum(r.tool_calls for r in rollouts),
        "tool_calls_per_traj": sum(r.tool_calls for r in rollouts) / len(rollouts),
        "turns_per_traj": sum(r.turns for r in rollouts) / len(rollouts),
        "finish_reasons": finish,
        "reward_mean": sum(t.reward for g, _ in results for t in g.trajectories) / len(rollouts),
        "repeats": args.repeats,
        "runs": [{k: round(v, 3) for k, v in r.items()} for r in runs],
        "agent_tokens_per_s_runs": [round(x, 1) for x in rate["agent"]],
        "raw_tokens_per_s_runs": [round(x, 1) for x in rate["raw"]],
        "wrapper_tokens_per_s_runs": [round(x, 1) for x in rate["wrapper"]],
        "replay_tokens_per_s_runs": [round(x, 1) for x in rate["replay"]],
        "agent_tokens_per_s": round(agent_tps, 1),
        "raw_tokens_per_s": round(raw_tps, 1),
        "wrapper_tokens_per_s": round(wrapper_tps, 1),
        "ratio": round(agent_tps / raw_tps, 3),
        # engine work of the agent loop includes prefilling every observation: tokens processed per second
        "agent_processed_tokens_per_s": round(agent_tps * (sampled + observation) / sampled, 1),
        "wrapper_ratio": round(wrapper_tps / raw_tps, 3),
        # the split of the gap: the engine's own multi-turn work (replay / raw), then the agent loop (agent / replay)
        "replay_tokens_per_s": round(replay_tps, 1),
        "replay_ratio": round(replay_tps / raw_tps, 3),
        "agent_over_replay_ratio": round(agent_tps / replay_tps, 3),
        "target_ratio": 0.8,
    }


def _device() -> str:
    """What the engine ran on, for the curve's source: the GPU's name, else the CPU model."""
    import torch

    from scripts.bench.bench_all import cpu_model

    return torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu: {cpu_model()}"


def main(argv: list[str] | None = None) -> int:
    if "--null-engine" in (sys.argv[1:] if argv is None else argv):
        return worker_ceiling.main(argv)
    args = _parse_args(argv)
    if args.curve is not None:
        args.curve = concurrencies(args.curve)
    if args.engines < 1 or (args.engines > 1 and args.curve is None):
        raise SystemExit(f"--engines {args.engines}: expected >= 1, and more than 1 only with --curve")
    if args.curve_tokens < 1:
        raise SystemExit(f"--curve-tokens {args.curve_tokens}: expected >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import logging

    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="sr1-bench-generators-") as scratch:
        args.scratch = Path(scratch)
        figures = asyncio.run(_bench(args))
    if args.json:
        print(json.dumps(figures))
    elif args.curve is not None:
        print(f"engine decode tokens/s ({figures['device']}, {figures['model']}):")
        for n, rate in figures["engine_curve"]:
            print(f"  {n:>5} sequences  {rate:>12,.0f} tokens/s  {rate / n:>10,.1f} per sequence")
    else:
        width = max(map(len, figures))
        for key, value in figures.items():
            print(f"{key:<{width}}  {value}")
        print(f"\nagent loop keeps {figures['ratio']:.0%} of raw engine tokens/s (target >= 80%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
