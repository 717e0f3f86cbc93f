"""Attention for packed rows: every path that runs on CPU agrees with running each sequence alone, in log-probs and
gradients (the GPU paths' gradients: tests/gpu/test_learner_gpu.py); the kwargs each path receives; the choice by
device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from buffer.records import Group, Trajectory
from learner.execution.attention import (
    FLASH_VARLEN,
    FLEX_DOCUMENT,
    VARLEN_SDPA,
    attention_implementation,
    flash_attn_installed,
    register,
    varlen_sdpa_forward,
)
from learner.packing import attention_kwargs, pack, sequences_from_groups, token_logprobs

LENGTHS = [(5, 9), (3, 17), (8, 4), (2, 12)]  # (prompt, response) per packed sequence


def packed_sequences(seed: int = 0, lengths=LENGTHS):
    """Sequences of the given (prompt, response) lengths, every response token a loss token."""
    rng = np.random.default_rng(seed)
    trajectories = [
        Trajectory(
            prompt_ids=rng.integers(0, 500, p),
            response_ids=rng.integers(0, 500, r),
            loss_mask=np.ones(r, dtype=np.uint8),
            behavior_logprobs=np.full(r, -1.5),
            versions=np.zeros(r, dtype=np.int64),
            reward=1.0,
        )
        for p, r in lengths
    ]
    return sequences_from_groups([Group("g", "toy", 0, trajectories)], [np.zeros(len(lengths))])


def _model(model_dir, attn: str):
    from transformers import AutoModelForCausalLM

    register()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attn)


def _padded_logprobs(model, sequences, temperature: float) -> torch.Tensor:
    """Each sequence in its own row of a right-padded batch with a 2-D padding mask: the padded data loader."""
    longest = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.from_numpy(s.token_ids)
        mask[i, : len(s)] = 1
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float() / temperature
    log_probs = torch.log_softmax(logits, -1)
    parts = []
    for i, s in enumerate(sequences):
        p, n = s.prompt_len, len(s)
        targets = torch.from_numpy(s.token_ids[p:])
        parts.append(log_probs[i, p - 1 : n - 1].gather(-1, targets[:, None])[:, 0])
    return torch.cat(parts)


def test_the_loop_packed_and_padded_agree_in_logprobs_and_gradients(tiny_model_dir):
    """The per-sequence SDPA loop on a packed row (the CPU path), SDPA with a T x T block-causal mask on the same row
    and a padded batch: the same log-probs and the same parameter gradients."""
    sequences = packed_sequences()
    mb = pack(sequences)
    weights = torch.linspace(-1, 1, int(mb.keep.numel()))
    results = {}
    for name, attn in (("loop", VARLEN_SDPA), ("masked", "sdpa"), ("padded", "sdpa")):
        model = _model(tiny_model_dir, attn).train()  # train mode, as the trainer runs it (dropout is 0)
        if name == "padded":
            logprobs = _padded_logprobs(model, sequences, 0.7)
        else:
            logprobs, _ = token_logprobs(model, mb, 0.7, with_entropy=False)
        (logprobs * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results[name] = (logprobs.detach(), grads)
    loop_logprobs, loop_grads = results["loop"]
    for name in ("masked", "padded"):
        logprobs, grads = results[name]
        torch.testing.assert_close(logprobs, loop_logprobs, atol=1e-5, rtol=1e-5, msg=name)
        for param, grad in grads.items():
            torch.testing.assert_close(grad, loop_grads[param], atol=1e-5, rtol=1e-4, msg=f"{name}: {param}")


def test_flex_document_mask_gives_the_loops_logprobs(tiny_model_dir):
    """FlexAttention with the document-causal BlockMask (forward only here: FlexAttention has no CPU backward; its
    gradients are compared on CUDA by tests/gpu) and a row longer than one 128-token block."""
    sequences = packed_sequences(1, [(7, 150), (3, 20), (40, 90)])
    mb = pack(sequences)
    with torch.no_grad():
        loop, loop_entropy = token_logprobs(_model(tiny_model_dir, VARLEN_SDPA).eval(), mb, 0.7)
        flex_model = _model(tiny_model_dir, FLEX_DOCUMENT).eval()
        kwargs = attention_kwargs(flex_model, mb)
        assert set(kwargs) == {"attention_mask"} and type(kwargs["attention_mask"]).__name__ == "BlockMask"
        flex, flex_entropy = token_logprobs(flex_model, mb, 0.7)
    torch.testing.assert_close(flex, loop, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flex_entropy, loop_entropy, atol=1e-5, rtol=1e-5)


def test_the_block_mask_passes_through_fsdp2(world, tiny_model_dir):
    """Under FSDP2 (its root unit's pre-forward hook walks the forward's inputs) the BlockMask reaches every layer
    unchanged: the sharded model's log-probs equal the loop's."""
    from learner.model import load_policy

    mb = pack(packed_sequences(2, [(7, 150), (3, 20), (40, 90)]))
    with torch.no_grad():
        loop, _ = token_logprobs(load_policy(tiny_model_dir, world, trainable=False), mb, 1.0)
        flex_model = load_policy(tiny_model_dir, world, trainable=False, attention=FLEX_DOCUMENT)
        assert flex_model.config._attn_implementation == FLEX_DOCUMENT
        flex, _ = token_logprobs(flex_model, mb, 1.0)
    torch.testing.assert_close(flex, loop, atol=1e-5, rtol=1e-5)


def test_each_path_gets_its_boundaries_in_its_own_form(tiny_model_dir):
    mb = pack(packed_sequences())
    bounds = np.cumsum([0, *mb.seq_lens]).tolist()
    model = _model(tiny_model_dir, VARLEN_SDPA)
    loop = attention_kwargs(model, mb)
    # a host list: the loop slices with it in every layer without reading anything back from the device
    assert loop == {"cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": 20, "max_length_k": 20}
    model.config._attn_implementation = (
        FLASH_VARLEN  # the kwargs only (flash-attn itself is not installed here)
    )
    flash = attention_kwargs(model, mb)
    assert flash["cu_seq_lens_q"].dtype == torch.int32 and flash["cu_seq_lens_q"].tolist() == bounds
    assert flash["max_length_q"] == flash["max_length_k"] == 20 and isinstance(flash["max_length_q"], int)
    assert "attention_mask" not in flash  # flash-attention would take a 2-D mask for padding


def test_the_loop_refuses_device_boundaries():
    q = torch.zeros(1, 2, 6, 4)
    with pytest.raises(TypeError, match="list of ints"):
        varlen_sdpa_forward(torch.nn.Module(), q, q, q, None, cu_seq_lens_q=torch.tensor([0, 3, 6]))


def test_the_attention_is_chosen_by_device():
    assert attention_implementation(torch.device("cpu")) == VARLEN_SDPA
    assert attention_implementation(torch.device("cpu"), FLEX_DOCUMENT) == FLEX_DOCUMENT
    cuda = FLASH_VARLEN if flash_attn_installed() else FLEX_DOCUMENT
    assert attention_implementation(torch.device("cuda")) == cuda
    with pytest.raises(ValueError, match="'flash' is not one of auto, flash_attention_2"):
        attention_implementation(torch.device("cpu"), "flash")
    if not flash_attn_installed():
        with pytest.raises(ValueError, match="needs the flash-attn package"):
            attention_implementation(torch.device("cuda"), FLASH_VARLEN)


@pytest.mark.parametrize("lengths", [[(3, 20), (5, 9)], [(7, 121)], [(40, 90), (3, 123)]])
def test_flex_pads_the_row_to_whole_blocks_and_drops_the_padding(tiny_model_dir, lengths):
    """Rows of 37, 128 and 256 tokens: FlexAttention runs at whole 128-token blocks (below one block the compiler
    would pick its decoding kernel), the padding is a sequence of its own, and the log-probs are the loop's."""
    from learner.execution.attention import document_causal_block_mask, flex_padded_length

    mb = pack(packed_sequences(3, lengths))
    total = int(sum(mb.seq_lens))
    assert (
        document_causal_block_mask(mb.seq_lens, torch.device("cpu")).seq_lengths
        == (flex_padded_length(total),) * 2
    )
    assert flex_padded_length(total) % 128 == 0 and 0 <= flex_padded_length(total) - total < 128
    with torch.no_grad():
        loop, _ = token_logprobs(_model(tiny_model_dir, VARLEN_SDPA).eval(), mb, 0.7)
        flex, _ = token_logprobs(_model(tiny_model_dir, FLEX_DOCUMENT).eval(), mb, 0.7)
    torch.testing.assert_close(flex, loop, atol=1e-5, rtol=1e-5)
