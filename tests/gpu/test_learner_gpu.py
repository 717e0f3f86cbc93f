"""The learner on a CUDA GPU: the GPU attention paths against the per-sequence loop (log-probs and gradients), the
bf16 mixed-precision step, FSDP2 with cpu_offload, fused AdamW on the shards, the chunked head in bf16, the
publisher's bf16 gather, and the benchmark's CUDA run. Skipped without CUDA (tests/gpu/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fakes.groups import random_groups
from learner.execution.attention import (
    FLASH_VARLEN,
    FLEX_DOCUMENT,
    VARLEN_SDPA,
    VARLEN_TORCH,
    flash_attn_installed,
    register,
    torch_varlen_available,
)
from learner.packing import pack, token_logprobs
from learner.settings import LearnerConfig
from tests.unit.learner.test_attention import packed_sequences

pytestmark = pytest.mark.gpu

GPU_PATHS = (
    [FLEX_DOCUMENT]
    + ([FLASH_VARLEN] if flash_attn_installed() else [])
    + ([VARLEN_TORCH] if torch_varlen_available() else [])
)
HALF_ONLY = (FLASH_VARLEN, VARLEN_TORCH)  # flash-attention kernels: bf16/fp16 only


def _hf_model(model_dir, attn: str, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    register()
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attn, dtype=dtype)
    return model.cuda().train()


def _logprobs_and_grads(model, mb, weights):
    logprobs, entropy = token_logprobs(model, mb, 0.7)
    (logprobs * weights + 0.1 * entropy).sum().backward()
    return logprobs.detach().float(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("attn", GPU_PATHS)
def test_gpu_attention_matches_the_loop_in_logprobs_and_gradients(tiny_model_dir, attn):
    """fp32 (tight) and bf16 (loose: rounding differs between kernels) on a row with sequences across 128-token
    blocks; the flash-attention kernels (flash-attn's, torch's varlen) run in bf16 only."""
    mb = pack(packed_sequences(1, [(7, 150), (3, 20), (40, 90), (5, 300)])).to(torch.device("cuda"))
    weights = torch.linspace(-1, 1, int(mb.keep.numel()), device="cuda")
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
        if attn in HALF_ONLY and dtype == torch.float32:
            continue
        loop_lp, loop_grads = _logprobs_and_grads(_hf_model(tiny_model_dir, VARLEN_SDPA, dtype), mb, weights)
        lp, grads = _logprobs_and_grads(_hf_model(tiny_model_dir, attn, dtype), mb, weights)
        torch.testing.assert_close(lp, loop_lp, atol=tolerance, rtol=tolerance, msg=f"{dtype} log-probs")
        for name, grad in grads.items():
            scale = loop_grads[name].abs().max().clamp(min=1e-6)
            assert (grad - loop_grads[name]).abs().max() / scale < tolerance * 10, f"{dtype} {name}"


def test_the_learner_picks_the_fastest_measured_kernel_on_cuda(
    cuda_world, tiny_model_dir, tmp_path, monkeypatch
):
    """auto times every kernel present on a probe row and takes the fastest; the choice is cached (on disk too)."""
    from learner.execution.attention_choice import _cache, cuda_candidates
    from learner.trainer import Learner

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _cache.clear()
    cfg = LearnerConfig(groups_per_step=2, micro_batch_tokens=256)
    learner = Learner(cfg, tiny_model_dir, cuda_world, model_dtype="bfloat16")
    seconds = learner.execution.attention_seconds
    assert set(seconds) == set(cuda_candidates(torch.bfloat16)) and all(s > 0 for s in seconds.values())
    assert learner.model.config._attn_implementation == min(seconds, key=seconds.get)
    assert (tmp_path / "sr1" / "attention.json").is_file()
    assert learner.optimizer.defaults["fused"] is True
    assert learner.execution.compile and learner.execution.logprob_head == "fused"


def test_a_micro_batch_budget_that_cannot_fit_fails_before_the_first_step(cuda_world, tiny_model_dir):
    from learner.trainer import Learner

    cfg = LearnerConfig(groups_per_step=2, micro_batch_tokens=50_000_000)
    with pytest.raises(ValueError, match=r"micro_batch_tokens \(50000000\) does not fit on .*<= \d+"):
        Learner(cfg, tiny_model_dir, cuda_world)


@pytest.mark.parametrize("attention", [*GPU_PATHS, VARLEN_SDPA])
def test_bf16_mixed_precision_step_trains(cuda_world, tiny_model_dir, attention):
    from learner.trainer import Learner

    cfg = LearnerConfig(groups_per_step=2, lr=1e-3, micro_batch_tokens=256)
    learner = Learner(cfg, tiny_model_dir, cuda_world, model_dtype="bfloat16", attention=attention)
    assert all(p.dtype == torch.float32 for p in learner.model.parameters())  # fp32 master weights
    weight = "model.layers.0.self_attn.q_proj.weight"
    before = learner.model.state_dict()[weight].full_tensor().clone()
    metrics = learner.train_step(random_groups(np.random.default_rng(0), n_groups=2, group_size=4, version=0))
    assert np.isfinite(metrics["loss/pg"]) and metrics["loss/grad_norm"] > 0
    assert metrics["loss/nonfinite_skipped"] == 0.0
    assert not torch.equal(learner.model.state_dict()[weight].full_tensor(), before)


def test_cpu_offload_on_cuda_gives_the_same_step(cuda_world, tiny_model_dir):
    """FSDP2's CPUOffloadPolicy (pinned host memory, the optimizer on the CPU) against the step on the GPU."""
    from learner.trainer import Learner

    groups = random_groups(np.random.default_rng(1), n_groups=2, group_size=4, version=0)
    metrics, weights = [], []
    for offload in (False, True):
        cfg = LearnerConfig(groups_per_step=2, lr=1e-3, micro_batch_tokens=256, cpu_offload=offload)
        learner = Learner(cfg, tiny_model_dir, cuda_world)
        learner.train_step(groups)
        metrics.append(learner.train_step(groups))
        devices = {p.device.type for p in learner.model.parameters()}
        assert devices == ({"cpu"} if offload else {"cuda"})
        if offload:
            assert all(p.to_local().is_pinned() for p in learner.model.parameters())
        weights.append({k: v.full_tensor().cpu() for k, v in learner.model.state_dict().items()})
    for key in ("loss/pg", "loss/grad_norm", "loss/entropy"):
        assert metrics[0][key] == pytest.approx(metrics[1][key], rel=1e-3, abs=1e-6), key
    for name, tensor in weights[0].items():
        torch.testing.assert_close(weights[1][name], tensor, atol=1e-4, rtol=1e-3, msg=name)


def test_fused_adamw_on_cuda_shards_matches_the_loop(cuda_world, tiny_model_dir):
    from learner.model import build_optimizer, clip_and_step, load_policy
    from tests.unit.learner.test_optimizer import SETTINGS, fake_gradients

    results = []
    for fused in (True, False):
        model = load_policy(tiny_model_dir, cuda_world)
        optimizer, _ = build_optimizer(model, SETTINGS)
        if not fused:
            optimizer = torch.optim.AdamW(
                model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01, foreach=False
            )
        for step in range(3):
            fake_gradients(model, step)
            clip_and_step(model, optimizer, max_norm=1.0)
        results.append({k: v.full_tensor() for k, v in model.state_dict().items()})
    for name, tensor in results[0].items():
        torch.testing.assert_close(tensor, results[1][name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("head", ["chunked", "fused"])
def test_chunked_logprobs_in_bf16_match_full_logits(tiny_model_dir, head):
    """The chunked and the fused head (its kernels compiled: Triton) with bf16 hidden states and weight (as under
    FSDP2 mixed precision) against fp32 logits of the same bf16 products."""
    from learner.execution.chunked_logprobs import chunked_logprobs
    from learner.execution.fused_head import fused_logprobs

    run = fused_logprobs if head == "fused" else chunked_logprobs
    torch.manual_seed(0)
    hidden = torch.randn(300, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(5000, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 5000, (300,), device="cuda")
    logprobs, entropy = run(hidden, weight, targets, temperature=0.7, chunk_tokens=64, with_entropy=True)
    (logprobs.sum() + entropy.sum()).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    log_p = torch.log_softmax((hidden @ weight.T).float() / 0.7, -1)
    full = log_p.gather(-1, targets[:, None])[:, 0]
    full_entropy = -(log_p.exp() * log_p).sum(-1)
    (full.sum() + full_entropy.sum()).backward()
    torch.testing.assert_close(logprobs, full, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(entropy, full_entropy, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(grads[0], hidden.grad, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(grads[1], weight.grad, atol=2e-2, rtol=2e-2)


def test_publisher_bf16_gather_on_cuda(cuda_world, tiny_model_dir):
    """The publisher casts each CUDA shard to bf16 before the all-gather: the values of casting after it."""
    from learner.model import load_policy
    from weight_sync.publisher import gather_for_wire

    model = load_policy(tiny_model_dir, cuda_world)
    for name, tensor in model.state_dict().items():
        wire = gather_for_wire(tensor, torch.bfloat16)
        assert wire.device.type == "cuda" and wire.dtype == torch.bfloat16, name
        torch.testing.assert_close(wire, tensor.full_tensor().to(torch.bfloat16), atol=0, rtol=0, msg=name)


def test_the_benchmark_runs_on_cuda(capsys):
    """bench_learner.py --device cuda on the small model: packed, padded and the plain step, with MFU and peaks."""
    import scripts.bench.bench_learner as bench_learner

    assert bench_learner.main(["--device", "cuda", "--quick", "--json", "--steps", "1"]) == 0
    import json

    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("packed", "padded", "plain"):
        assert result[f"{key}/tokens_per_s"] > 0 and result[f"{key}/peak_gib"] > 0
        assert 0 < result[f"{key}/mfu"] < 1
    assert result["gpu"] and result["cuda"] and result["attention"] in GPU_PATHS


def test_the_benchmark_runs_the_search_r1_step_on_cuda(capsys):
    """bench_learner.py --workload search-r1 on CUDA, scaled down: the preset's step with the reference and proximal
    forwards, the plain step beside it, the peak beside learner/execution/memory.py's estimate, the compiler's counters."""
    import json

    import scripts.bench.bench_learner as bench_learner

    argv = ["--device", "cuda", "--workload", "search-r1", "--length-scale", "0.1", "--trajectories", "8"]
    argv += ["--warmup-trajectories", "2", "--budget", "2048", "--json"]
    assert bench_learner.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["workload"] == "search-r1" and result["dtype"] == "bfloat16" and result["gpu"]
    assert result["reference_forward"] and result["proximal_forward"]
    for mode in ("packed", "plain"):
        assert result[f"{mode}/tokens_per_s"] > 0 and result[f"{mode}/peak_gib"] > 0
        assert 0 < result[f"{mode}/mfu"] < result[f"{mode}/mfu_all_passes"] < 1
    assert result["packed/estimate_gib"] > 0
    assert isinstance(result["compiler/graphs"], int) and isinstance(result["compiler/timed/recompiles"], int)
    if result["attention"] == FLEX_DOCUMENT or result["compile"]:
        assert result["compiler/graphs"] > 0  # FlexAttention and the compiled layers
    assert result["gradient_checkpointing"] == "full" and result["execution"].startswith("attention ")
    assert set(result["attention_seconds"]) >= {result["attention"]}  # auto timed the kernels present
