"""Packing: bin planning, target alignment, packed log-probs equal to per-sequence log-probs, and the chunked head
equal to full logits under FSDP2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from buffer.records import Group, Trajectory
from learner.packing import (
    pack,
    pack_micro_batches,
    plan_micro_batches,
    sequences_from_groups,
    split_across_ranks,
    token_logprobs,
)


def _trajectory(rng, prompt_len, response_len, vocab=500):
    mask = np.ones(response_len, dtype=np.uint8)
    mask[response_len // 3 : response_len // 3 + 2] = 0  # an observation block
    versions = np.where(mask == 1, 0, -1)
    return Trajectory(
        prompt_ids=rng.integers(0, vocab, prompt_len),
        response_ids=rng.integers(0, vocab, response_len),
        loss_mask=mask,
        behavior_logprobs=np.where(mask == 1, -1.5, 0.0),
        versions=versions,
        reward=1.0,
    )


def test_plan_respects_the_budget_and_covers_every_sequence():
    lengths = [30, 10, 25, 5, 17, 40, 3]
    plan = plan_micro_batches(lengths, 45)
    assert sorted(i for b in plan for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 45 for b in plan)
    with pytest.raises(ValueError, match="exceeds learner.micro_batch_tokens"):
        plan_micro_batches([50], 45)


def test_split_across_ranks_balances_tokens():
    lengths = [5, 3, 4, 5, 3, 4, 6, 6]
    shares = split_across_ranks(lengths, 2)
    assert sorted(i for s in shares for i in s) == list(range(8))
    assert [sum(lengths[i] for i in s) for s in shares] == [18, 18]


def test_pack_aligns_targets_with_response_tokens():
    rng = np.random.default_rng(0)
    group = Group("g", "toy", 0, [_trajectory(rng, 3, 6), _trajectory(rng, 2, 4)])
    seqs = sequences_from_groups([group], [np.array([0.5, -0.5])])
    mb = pack(seqs)
    assert mb.num_tokens == 15
    # first sequence: positions 2..7 predict its 6 response tokens
    t0 = group.trajectories[0]
    np.testing.assert_array_equal(mb.target_ids[2:8].numpy(), t0.response_ids)
    np.testing.assert_array_equal(mb.loss_mask[2:8].numpy(), t0.loss_mask)
    assert mb.keep.tolist() == [2, 3, 4, 5, 6, 7, 10, 11, 12, 13]
    assert mb.advantages[10].item() == -0.5 and mb.position_ids[0, 9].item() == 0


@pytest.mark.parametrize("attn", ["sdpa", "sr1_varlen_sdpa"])
def test_packed_logprobs_equal_per_sequence_logprobs(tiny_model_dir, attn):
    from transformers import AutoModelForCausalLM

    from learner.execution.attention import register

    register()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn).eval()
    rng = np.random.default_rng(1)
    group = Group("g", "toy", 0, [_trajectory(rng, p, r) for p, r in [(5, 9), (3, 17), (8, 4), (2, 12)]])
    seqs = sequences_from_groups([group], [np.zeros(4)])
    with torch.no_grad():
        separate = [token_logprobs(model, pack([s]), temperature=0.7) for s in seqs]
        batches = pack_micro_batches(seqs, budget=40)
        assert len(batches) > 1 and any(len(b.seq_lens) > 1 for b in batches)
        packed_all = pack(seqs)
        packed, packed_entropy = token_logprobs(model, packed_all, temperature=0.7)
    torch.testing.assert_close(packed, torch.cat([lp for lp, _ in separate]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed_entropy, torch.cat([e for _, e in separate]), atol=1e-5, rtol=1e-5)
    # and the separation matters: plain causal attention over the row lets later sequences see earlier ones
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    with torch.no_grad():
        logits = plain(
            input_ids=packed_all.input_ids, attention_mask=torch.ones_like(packed_all.input_ids)
        ).logits[0]
    leaked = torch.log_softmax(logits.float() / 0.7, -1)[packed_all.keep].gather(
        -1, packed_all.target_ids[packed_all.keep][:, None]
    )[:, 0]
    assert not torch.allclose(leaked, packed, atol=1e-4)


def test_varlen_attention_falls_back_to_sdpa_on_padded_batches(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from learner.execution.attention import VARLEN_SDPA, register

    register()
    varlen = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=VARLEN_SDPA).eval()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    ids = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        a = varlen(input_ids=ids, attention_mask=mask).logits
        b = plain(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()])


def tied_copy(model_dir, out_dir):
    """The tiny policy with its LM head tied to the embeddings (as Qwen2.5-0.5B..3B are)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out_dir)
    return out_dir


def full_logits_logprobs(model, mb, temperature):
    """The log-probs and entropies as the trainer computed them before the chunked head: all logits at once."""
    from learner.packing import attention_kwargs

    out = model(
        input_ids=mb.input_ids,
        position_ids=mb.position_ids,
        logits_to_keep=mb.keep,
        use_cache=False,
        **attention_kwargs(model, mb),
    )
    log_probs = torch.log_softmax(out.logits[0].float() / temperature, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, mb.target_ids[mb.keep][:, None])[:, 0], entropy


@pytest.mark.parametrize("tied", [False, True])
def test_fsdp_token_logprobs_and_grads_equal_full_logits(world, tiny_model_dir, tmp_path, tied):
    """Under FSDP2 (root unit holding embeddings and head), over two accumulated micro-batches."""
    from learner.model import load_policy

    model_dir = tied_copy(tiny_model_dir, tmp_path / "tied") if tied else tiny_model_dir
    rng = np.random.default_rng(2)
    group = Group("g", "toy", 0, [_trajectory(rng, p, r) for p, r in [(5, 19), (3, 27), (8, 14)]])
    mb = pack(sequences_from_groups([group], [np.zeros(3)]))
    results = {}
    for path in ("chunked", "full"):
        model = load_policy(model_dir, world)
        for step in range(2):
            model.set_requires_gradient_sync(step == 1)
            if path == "chunked":
                logprobs, entropy = token_logprobs(model, mb, 0.7, with_entropy=True, chunk_tokens=7)
            else:
                logprobs, entropy = full_logits_logprobs(model, mb, 0.7)
            (logprobs * torch.linspace(-1, 1, len(logprobs)) + 0.1 * entropy).sum().backward()
        grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
        results[path] = (logprobs.detach(), entropy.detach(), grads)
    (lp_a, ent_a, grads_a), (lp_b, ent_b, grads_b) = results["chunked"], results["full"]
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_a, ent_b, atol=1e-5, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys() and ("lm_head.weight" in grads_a) != tied
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-5, msg=name)


def test_token_logprobs_refuses_a_model_that_reshapes_its_logits(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.final_logit_softcapping = 30.0
    rng = np.random.default_rng(3)
    mb = pack(sequences_from_groups([Group("g", "toy", 0, [_trajectory(rng, 3, 6)])], [np.zeros(1)]))
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        token_logprobs(model, mb, 1.0)
