"""The engine alone, as scripts/bench/bench_generators.py measures it beside the agent loop: bare requests that
sample exactly n tokens (EOS ignored, no stop strings or log-probs), the raw and replay phases built from them, and
the decode curve (`--curve`: one engine's decode tokens/s at each concurrency).
"""

from __future__ import annotations

import asyncio
import time


async def bounded(jobs: list, limit: int) -> list:
    """Await the coroutines in `jobs` with at most `limit` running; a new one starts when one ends."""
    gate = asyncio.Semaphore(limit)

    async def one(job):
        async with gate:
            return await job

    return await asyncio.gather(*(one(job) for job in jobs))


async def exactly(engine, prompt: list[int], n: int, temperature: float) -> list[int]:
    """One bare engine request: n tokens sampled from `prompt`, EOS ignored, no stop strings, no log-probs, final
    output only."""
    import uuid

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=n, temperature=temperature, ignore_eos=True)
    last = None
    async for out in engine.llm.generate(TokensPrompt(prompt_token_ids=prompt), params, uuid.uuid4().hex):
        last = out
    return list(last.outputs[0].token_ids)


async def timed(phase: str, jobs: list, in_flight: int, expected_tokens: int) -> float:
    """Run `jobs` (each returning its token count) at most `in_flight` at once; wall seconds, after checking that
    exactly the expected number of tokens came out."""
    start = time.perf_counter()
    counts = await bounded(jobs, in_flight)
    elapsed = time.perf_counter() - start
    if sum(counts) != expected_tokens:
        raise RuntimeError(f"{phase} phase generated {sum(counts)} tokens, expected {expected_tokens}")
    return elapsed


async def raw_phase(
    engine, requests: list[tuple[list[int], int]], temperature: float, *, wrapper: bool, in_flight: int
) -> float:
    """Generate exactly n tokens from each prompt, at most `in_flight` requests at once; returns wall seconds."""
    from generators.engine import SamplingSpec

    async def one(prompt: list[int], n: int) -> int:
        if wrapper:
            # the wrapper has no ignore_eos: sample until n tokens, continuing after an EOS like a new turn would
            got, context = 0, list(prompt)
            while got < n:
                spec = SamplingSpec(max_tokens=n - got, temperature=temperature, stop=())
                gen = await engine.generate(context, spec)
                got += len(gen.token_ids)
                context += gen.token_ids
            return got
        return len(await exactly(engine, prompt, n, temperature))

    jobs = [one(p, n) for p, n in requests if n > 0]
    return await timed("raw", jobs, in_flight, sum(n for _, n in requests))


def segments(rollout) -> list[tuple[bool, list[int]]]:
    """A trajectory's response as runs of (sampled?, token ids): turns the model sampled, observations between."""
    runs: list[tuple[bool, list[int]]] = []
    for token, mask in zip(rollout.response_ids, rollout.loss_mask, strict=True):
        if runs and runs[-1][0] == bool(mask):
            runs[-1][1].append(token)
        else:
            runs.append((bool(mask), [token]))
    return runs


async def wave(engines: list, prompts: list[list[int]], n: int, tokens: int, temperature: float) -> float:
    """Wall seconds for n requests on each engine, all started together, each sampling exactly `tokens` tokens."""
    start = time.perf_counter()
    outs = await asyncio.gather(
        *(
            exactly(engine, prompts[i % len(prompts)], tokens, temperature)
            for engine in engines
            for i in range(n)
        )
    )
    elapsed = time.perf_counter() - start
    if any(len(out) != tokens for out in outs):
        raise RuntimeError(f"a wave of {n} requests did not sample exactly {tokens} tokens each")
    return elapsed


async def curve(
    engines: list,
    prompts: list[list[int]],
    concurrencies: list[int],
    extra: int,
    repeats: int,
    temperature: float,
) -> list[list[float]]:
    """[concurrency, decode tokens/s of one engine] for each concurrency, every engine batching that many at once:
    short and long waves alternate, and the rate is the extra tokens over the difference of their median times
    (prefills and per-request costs cancel)."""
    import statistics

    short = 4
    points = []
    for n in concurrencies:
        await wave(engines, prompts, n, short + extra, temperature)  # warm-up: this batch size's first steps
        times: dict[int, list[float]] = {short: [], short + extra: []}
        for _ in range(repeats):
            for tokens, measured in times.items():
                for engine in engines:
                    await engine.llm.reset_prefix_cache()
                measured.append(await wave(engines, prompts, n, tokens, temperature))
        decode_s = statistics.median(times[short + extra]) - statistics.median(times[short])
        if decode_s <= 0:
            raise RuntimeError(
                f"at {n} sequences the waves of {short + extra} tokens were not slower than those of {short}: "
                "too noisy to measure (raise --curve-tokens or --repeats, or quiet the machine)"
            )
        points.append([n, round(n * extra / decode_s, 1)])
    return points


async def replay_phase(engine, rollouts: list, temperature: float, in_flight: int) -> float:
    """The agent's engine work without the agent: per trajectory, the same turns (one request each, as many
    tokens as that turn sampled, EOS ignored) with the same observation tokens appended between them, so the
    prefills and prefix-cache hits are the agent's; no stop strings, log-probs, search or parsing. Wall seconds."""

    async def one(rollout) -> int:
        context, got = list(rollout.prompt_ids), 0
        for sampled, ids in segments(rollout):
            if sampled:
                ids = await exactly(engine, context, len(ids), temperature)
                got += len(ids)
            context += ids
        return got

    jobs = [one(r) for r in rollouts]
    return await timed("replay", jobs, in_flight, sum(r.sampled_tokens for r in rollouts))
