"""The chunked LM head equals full-logits log-softmax (values and gradients), and skips entropy work it is not asked
for; the trainer's step does not depend on the chunk size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import learner.execution.chunked_logprobs as chunked
from learner.execution.chunked_logprobs import chunked_logprobs


def _inputs(num_tokens=37, hidden=16, vocab=101, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden_states = torch.randn(num_tokens, hidden, generator=gen, dtype=dtype).requires_grad_()
    weight = (0.5 * torch.randn(vocab, hidden, generator=gen, dtype=dtype)).requires_grad_()
    targets = torch.randint(0, vocab, (num_tokens,), generator=gen)
    return hidden_states, weight, targets


def _full_logits(hidden_states, weight, targets, temperature):
    """What the trainer computed before the chunked head: every logit at once, log-softmax, gather."""
    log_probs = torch.log_softmax((hidden_states @ weight.T).float() / temperature, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, targets[:, None])[:, 0], entropy


def _loss_and_grads(fn, hidden_states, weight, entropy_in_loss):
    logprobs, entropy = fn()
    gen = torch.Generator().manual_seed(1)
    loss = (logprobs * torch.randn(logprobs.shape, generator=gen)).sum()
    if entropy_in_loss:
        loss = loss + (entropy * torch.randn(entropy.shape, generator=gen)).sum()
    grads = torch.autograd.grad(loss, (hidden_states, weight))
    return logprobs.detach(), entropy.detach(), *grads


@pytest.mark.parametrize("chunk_tokens", [1, 5, 16, 37, 64])  # 5, 16: chunks that do not divide 37 tokens
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_in_loss", [False, True])
def test_chunked_head_equals_full_logits(chunk_tokens, temperature, entropy_in_loss):
    hidden_states, weight, targets = _inputs()
    expected = _loss_and_grads(
        lambda: _full_logits(hidden_states, weight, targets, temperature),
        hidden_states,
        weight,
        entropy_in_loss,
    )
    got = _loss_and_grads(
        lambda: chunked_logprobs(
            hidden_states,
            weight,
            targets,
            temperature=temperature,
            chunk_tokens=chunk_tokens,
            with_entropy=True,
        ),
        hidden_states,
        weight,
        entropy_in_loss,
    )
    for name, a, b in zip(["logprobs", "entropy", "grad hidden", "grad weight"], got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_low_precision_weights_match_their_own_full_logits():
    """bf16 head (FSDP2 mixed precision): logits from the bf16 matmul, then fp32 math; weight grads summed in fp32."""
    hidden_states, weight, targets = _inputs(num_tokens=50, dtype=torch.bfloat16)
    expected = _loss_and_grads(
        lambda: _full_logits(hidden_states, weight, targets, 1.0), hidden_states, weight, True
    )
    got = _loss_and_grads(
        lambda: chunked_logprobs(hidden_states, weight, targets, chunk_tokens=16, with_entropy=True),
        hidden_states,
        weight,
        True,
    )
    assert got[2].dtype == got[3].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)  # same bf16 logits, fp32 from there
    torch.testing.assert_close(got[1], expected[1], atol=1e-5, rtol=1e-5)
    for a, b in zip(got[2:], expected[2:], strict=True):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)  # bf16 rounding of the matmuls


def test_entropy_work_happens_only_when_asked(monkeypatch):
    calls = {"forward": 0, "backward": 0}
    forward, backward = chunked.chunk_entropy, chunked.entropy_logit_grad

    def count(key, fn):
        def counted(*args):
            calls[key] += 1
            return fn(*args)

        return counted

    monkeypatch.setattr(chunked, "chunk_entropy", count("forward", forward))
    monkeypatch.setattr(chunked, "entropy_logit_grad", count("backward", backward))
    hidden_states, weight, targets = _inputs()

    # not asked for: no entropy at all
    logprobs, entropy = chunked_logprobs(hidden_states, weight, targets, chunk_tokens=10)
    logprobs.sum().backward()
    assert entropy is None and calls == {"forward": 0, "backward": 0}

    # for the metric only (detached, as the trainer does with entropy_coef 0): forward only, one call per chunk
    logprobs, entropy = chunked_logprobs(hidden_states, weight, targets, chunk_tokens=10, with_entropy=True)
    entropy = entropy.detach()
    logprobs.sum().backward()
    assert calls == {"forward": 4, "backward": 0}

    # in the loss: its gradient term in the backward too
    logprobs, entropy = chunked_logprobs(hidden_states, weight, targets, chunk_tokens=10, with_entropy=True)
    (logprobs.sum() - 0.1 * entropy.sum()).backward()
    assert calls == {"forward": 8, "backward": 4}


def test_bad_shapes_and_chunk_sizes_are_refused():
    hidden_states, weight, targets = _inputs()
    with pytest.raises(ValueError, match="targets"):
        chunked_logprobs(hidden_states, weight, targets[:-1])
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        chunked_logprobs(hidden_states, weight, targets, chunk_tokens=0)


def test_trainer_step_does_not_depend_on_the_chunk_size(world, tiny_model_dir):
    from fakes.groups import random_groups
    from learner.algorithms.settings import GRPOConfig
    from learner.settings import LearnerConfig
    from learner.trainer import Learner

    groups = random_groups(np.random.default_rng(7), n_groups=2, group_size=3, version=0)
    metrics, weights = [], []
    for chunk in (3, 4096):
        cfg = LearnerConfig(
            groups_per_step=2,
            lr=1e-3,
            micro_batch_tokens=128,
            logprob_chunk_tokens=chunk,
            algorithm=GRPOConfig(entropy_coef=0.01),
        )
        learner = Learner(cfg, tiny_model_dir, world)
        metrics.append(learner.train_step(groups))
        weights.append(learner.model.state_dict()["lm_head.weight"].full_tensor().clone())
    for key in ("loss/pg", "loss/entropy", "loss/grad_norm", "is/weight_mean"):
        assert metrics[0][key] == pytest.approx(metrics[1][key], rel=1e-5), key
    torch.testing.assert_close(weights[0], weights[1], atol=1e-5, rtol=0)
