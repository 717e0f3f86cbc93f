"""Warm start: trajectories built piece by piece like the agent loop, masks only on sampled pieces, loss goes down."""

from __future__ import annotations

import pytest

from tasks.search_r1.protocol import INFORMATION_CLOSE, INFORMATION_OPEN, make_prompt_text
from world.kb import WorldSizes, build_kb, write_corpus
from world.warmstart import (
    build_trajectories,
    masked_logprobs,
    sequence_loss,
    sft,
    shared_prefix_length,
    tokenize_trajectory,
    tokenizer_texts,
)

SMALL = WorldSizes(num_people=60, num_first_names=12, num_last_names=30, num_cities=12, num_test=20)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from retrieval.bm25 import BM25Retriever
    from retrieval.corpus import DocStore

    kb = build_kb(0, SMALL)
    bm25 = BM25Retriever.build(
        DocStore(write_corpus(kb, tmp_path_factory.mktemp("c") / "corpus.jsonl")), threads=1
    )

    def search(queries):
        return bm25.search(queries, 3)

    return kb, search, build_trajectories(kb, search, 64, 0.3, seed=0)


@pytest.fixture(scope="module")
def policy(world, tmp_path_factory):
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from world.model import build_tiny_policy

    kb, _, trajectories = world
    out = build_tiny_policy(
        tmp_path_factory.mktemp("policy"), tokenizer_texts(kb, trajectories), vocab_size=512
    )
    torch.manual_seed(0)
    return AutoTokenizer.from_pretrained(out), Qwen2ForCausalLM.from_pretrained(out)


def test_trajectory_pieces_follow_the_protocol(world):
    kb, search, trajectories = world
    goods = sum(t.good_query for t in trajectories)
    assert 0 < goods < len(trajectories) / 2  # the imperfect query is the more frequent form
    for t in trajectories:
        prompt, first, obs, answer = t.pieces
        assert t.sampled == (False, True, False, True)
        assert prompt.startswith("Answer the given question.") and prompt.endswith("?\n")
        assert first.startswith("<think>") and first.endswith("</search>") and "</think> <search>" in first
        assert obs.startswith(INFORMATION_OPEN + "Doc 1(Title: ") and obs.endswith(INFORMATION_CLOSE)
        assert obs.count("\nDoc ") == 2  # top-3
        assert answer.startswith("<answer> ") and answer.endswith(" </answer>")
        # the answer copies the value of the first retrieved passage
        value = answer[len("<answer> ") : -len(" </answer>")]
        assert value in obs.split("\n")[2]


def test_good_trajectories_answer_correctly(world):
    kb, search, trajectories = world
    by_prompt = {make_prompt_text(q.question): q for q in kb.train}
    good = [t for t in trajectories if t.good_query]
    for t in good:
        q = by_prompt[t.pieces[0]]
        assert t.pieces[3] == f"<answer> {q.answer} </answer>"


def test_tokenized_piece_by_piece_with_masks_on_sampled_pieces(world, policy):
    _, _, trajectories = world
    tokenizer, _ = policy
    t = trajectories[0]
    ids, mask = tokenize_trajectory(tokenizer, t)
    expected_ids, expected_mask = [], []
    for piece, sampled in zip(t.pieces, t.sampled, strict=True):
        piece_ids = tokenizer(piece, add_special_tokens=False).input_ids
        expected_ids += piece_ids
        expected_mask += [int(sampled)] * len(piece_ids)
    assert ids == expected_ids and mask == expected_mask
    masked_text = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert masked_text == t.pieces[1] + t.pieces[3]
    # protocol tags are single tokens
    for tag in ("<search>", "</search>", "<answer>", "</answer>"):
        assert len(tokenizer(tag, add_special_tokens=False).input_ids) == 1


def test_shared_prefix_loss_equals_full_loss(world, policy):
    import torch

    _, _, trajectories = world
    tokenizer, model = policy
    seqs = [tokenize_trajectory(tokenizer, t) for t in trajectories[:6]]
    prefix = shared_prefix_length(seqs)
    assert prefix > 50  # the instruction template
    full = sequence_loss(model, seqs, tokenizer.pad_token_id, 0)
    shared = sequence_loss(model, seqs, tokenizer.pad_token_id, prefix)
    torch.testing.assert_close(full, shared, rtol=1e-4, atol=1e-5)
    logprobs, rows = masked_logprobs(model, seqs, tokenizer.pad_token_id, prefix)
    assert len(logprobs) == sum(sum(m) for _, m in seqs)
    assert rows.tolist() == sorted(rows.tolist())


def test_a_few_sft_steps_reduce_the_loss(world, policy):
    import copy

    _, _, trajectories = world
    tokenizer, model = policy
    model = copy.deepcopy(model)
    seqs = [tokenize_trajectory(tokenizer, t) for t in trajectories[:32]]
    before = sequence_loss(model, seqs, tokenizer.pad_token_id).item()
    losses = sft(model, seqs, tokenizer.pad_token_id, epochs=3, lr=3e-3, batch_size=8, seed=0, progress=False)
    after = sequence_loss(model, seqs, tokenizer.pad_token_id).item()
    assert len(losses) == 12
    assert after < before - 1.0


def test_copy_friendly_init_passes_embeddings_through(policy):
    import copy

    import torch

    from world.warmstart import copy_friendly_init

    _, model = policy
    model = copy.deepcopy(model)
    copy_friendly_init(model)
    torch.testing.assert_close(model.lm_head.weight, model.model.embed_tokens.weight)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()  # still untied
    attn = model.model.layers[-1].self_attn
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    x = torch.randn(model.config.hidden_size)
    through_head0 = attn.o_proj.weight[:, :head_dim] @ (attn.v_proj.weight[:head_dim] @ x)
    torch.testing.assert_close(through_head0[:head_dim], x[:head_dim])
    assert through_head0[head_dim:].abs().max() == 0


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_the_lean_forward_gives_transformers_log_probs_and_gradients(world, policy, shared_prefix):
    """What the warm start trains with (`world.lean`) is the same function as the model's own forward: every
    loss token's log-prob and every parameter's gradient agree (another summation order, nothing more)."""
    import copy

    import torch

    from world.lean import lean_logprobs

    _, _, trajectories = world
    tokenizer, model = policy
    model = copy.deepcopy(model)
    with torch.no_grad():  # away from the initialisation, where many weights are equal
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    seqs = [tokenize_trajectory(tokenizer, t) for t in trajectories[:6]]
    prefix = shared_prefix_length(seqs) if shared_prefix else 0
    results = []
    for forward in (masked_logprobs, lean_logprobs):
        model.zero_grad()
        logprobs, rows = forward(model, seqs, tokenizer.pad_token_id, prefix)
        (logprobs * torch.linspace(0.5, 1.5, len(logprobs))).sum().backward()
        results.append((logprobs.detach(), rows, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (want, want_rows, want_grads), (got, got_rows, got_grads) = results
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got_rows.tolist() == want_rows.tolist()
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
