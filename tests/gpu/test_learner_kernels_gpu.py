"""The learner's GPU performance code on CUDA: the log-prob heads' memory (the fused head's numbers in bf16:
tests/gpu/test_learner_gpu.py), compiled decoder layers (the
eager step's numbers, no graph breaks, few recompiles), every checkpointing policy under compile, and a step with
no host synchronisation inside its micro-batch loops. Skipped without CUDA (tests/gpu/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fakes.groups import random_groups
from learner.settings import LearnerConfig
from tests.gpu.test_learner_gpu import GPU_PATHS

pytestmark = pytest.mark.gpu

QWEN_VOCAB = 151_936


@pytest.mark.parametrize("head", ["fused", "chunked"])
def test_the_heads_memory_at_qwens_vocabulary(head):
    """A 16k-token micro-batch at 151,936 tokens of vocabulary (bf16, hidden 896): the head's peak beyond its
    inputs and their gradients stays under a quarter of the fp32 logits the unchunked head held (the fused head's
    is about 0.07x, the chunked one's about 0.18x)."""
    from learner.execution.chunked_logprobs import chunked_logprobs
    from learner.execution.fused_head import fused_logprobs

    run = fused_logprobs if head == "fused" else chunked_logprobs
    tokens, width = 16384, 896
    hidden = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(QWEN_VOCAB, width, device="cuda") * 0.02).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, QWEN_VOCAB, (tokens,), device="cuda")
    run(hidden[:64], weight, targets[:64], chunk_tokens=1024, with_entropy=True)[
        0
    ].sum().backward()  # compile
    hidden.grad = weight.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    logprobs, entropy = run(hidden, weight, targets, chunk_tokens=1024, with_entropy=True)
    (logprobs.sum() + 0.01 * entropy.sum()).backward()
    torch.cuda.synchronize()
    gradients = hidden.numel() * 2 + weight.numel() * 2
    extra = torch.cuda.max_memory_allocated() - base - gradients
    assert extra <= 0.25 * tokens * QWEN_VOCAB * 4, f"{head}: {extra / 2**30:.2f} GiB"


def _learner(world, model_dir, **settings):
    from learner.trainer import Learner

    base = dict(groups_per_step=2, lr=1e-3, micro_batch_tokens=256, attention="sr1_flex_document")
    return Learner(LearnerConfig(**(base | settings)), model_dir, world)


def _groups(seed: int, version: int = 0):
    return random_groups(np.random.default_rng(seed), n_groups=2, group_size=4, version=version)


def test_compiled_layers_give_the_eager_step_without_graph_breaks(cuda_world, tiny_model_dir):
    """fp32, FlexAttention inside the layers' graph: the same metrics and weights as eager layers over five steps of
    different packed shapes; no graph break; a few recompilations early (the BlockMask's length, one-block rows),
    none in the last step."""
    from learner.execution.compiled import compile_counters

    torch._dynamo.reset()
    results = []
    for compile in (False, True):
        learner = _learner(cuda_world, tiny_model_dir, compile=compile)
        assert learner.execution.compile is compile
        counts, metrics = [compile_counters()], []
        for seed in range(5):
            metrics.append(learner.train_step(_groups(seed, seed)))
            counts.append(compile_counters())
        weights = {k: v.full_tensor() for k, v in learner.model.state_dict().items()}
        results.append((metrics, weights, counts))
    (eager, eager_weights, _), (compiled, weights, counts) = results
    for a, b in zip(eager, compiled, strict=True):
        for key in ("loss/pg", "loss/grad_norm", "loss/entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, eager_weights[name], atol=1e-4, rtol=1e-3, msg=name)
    assert counts[-1]["graph_breaks"] == counts[0]["graph_breaks"]
    assert counts[-1]["recompiles"] - counts[0]["recompiles"] <= 4
    assert counts[-1]["recompiles"] == counts[-2]["recompiles"]


@pytest.mark.parametrize("policy", ["full", "every_n", "selective"])
def test_every_checkpointing_policy_under_compile_gives_the_step_of_none(cuda_world, tiny_model_dir, policy):
    metrics = []
    for checkpointing in ("none", policy):
        learner = _learner(cuda_world, tiny_model_dir, gradient_checkpointing=checkpointing, compile=True)
        assert learner.execution.checkpointing == checkpointing
        metrics.append(learner.train_step(_groups(5)))
    for key in ("loss/pg", "loss/grad_norm"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-4), key


@pytest.mark.parametrize("attention", [a for a in GPU_PATHS if a != "flash_attention_2"])
def test_no_host_synchronisation_inside_the_micro_batch_loops(cuda_world, tiny_model_dir, attention):
    """bf16, the reference's forward (kl_coef > 0), several micro-batches and updates: under
    torch.cuda.set_sync_debug_mode("error") inside the no-gradient pass and the update loop, any `.item()`,
    `bool()`, `.tolist()`, `.cpu()`, pageable copy or size-dependent op would raise. (flash_attention_2 is left
    out: transformers' flash path checks the position ids for packed sequences with one read per forward.)"""
    from learner.algorithms.settings import GRPOConfig
    from learner.trainer import Learner

    cfg = LearnerConfig(
        groups_per_step=2,
        lr=1e-3,
        micro_batch_tokens=128,
        ppo_mini_batch_size=4,
        attention=attention,
        algorithm=GRPOConfig(kl_coef=0.01),
    )
    learner = Learner(cfg, tiny_model_dir, cuda_world, model_dtype="bfloat16")
    groups = _groups(7)
    learner.train_step(groups)  # compiles every shape of these groups first: compiling may synchronise
    learner.sync_check = "error"
    metrics = learner.train_step(groups)  # the same shapes (staleness 1 is within the default bound)
    assert metrics["perf/micro_batches"] >= 4 and np.isfinite(metrics["loss/pg"])


def test_a_micro_batch_copies_to_the_gpu_without_waiting(cuda_world):
    from learner.execution.device import host_to_device, synchronisation_check
    from learner.packing import pack
    from tests.unit.learner.test_attention import packed_sequences

    mb = pack(packed_sequences(0))
    with synchronisation_check("error", torch.device("cuda")):
        on_gpu = mb.to(torch.device("cuda"))
        bounds = host_to_device(torch.tensor([0, 3, 7], dtype=torch.int32), torch.device("cuda"))
    for name, value in vars(mb).items():
        if isinstance(value, torch.Tensor):
            assert getattr(on_gpu, name).device.type == "cuda" and torch.equal(
                getattr(on_gpu, name).cpu(), value
            )
    assert bounds.tolist() == [0, 3, 7]
