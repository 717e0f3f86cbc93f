"""Supervised warm start of the tiny policy on search trajectories, so that it speaks the protocol before RL.

A warm-start trajectory is built exactly as the generators' agent loop builds one for the tiny preset (no chat
template): the prompt is the task's prompt; the model's first turn `<think> ... </think> <search> query </search>`,
the observation (the task's `<information>` block over the top-3 passages of the real BM25 index) and the model's
second turn `<answer> value </answer>` are each tokenized on their own and concatenated, and the loss covers only the
model's turns. The answer always copies the attribute of the first passage, so the policy's exact match depends on
its query: what RL then has to learn.

Why its own loop and not the learner's step (`learner.trainer.Learner.train_step`). That step is an RL update: it
takes the buffer's `Group`s (sampled trajectories with their behaviour log-probs, policy versions and rewards),
checks staleness, shapes the rewards, computes the algorithm's advantages (group-relative, or a critic's) and
minimises its policy-gradient loss with importance weights and clipping. The warm start has none of that to give:
its trajectories are written, not sampled (no behaviour log-probs, no versions, no reward), and its objective is
plain cross-entropy, the mean negative log-likelihood of the model's tokens (`sequence_loss`). Expressing that
through the step would take invented log-probs, rewards and an algorithm whose advantage is 1 on every token, and
even then the numbers would differ:
- the optimizer and schedule: here torch's default (unfused) AdamW with betas (0.9, 0.98) and weight decay 0.01, a
  linear warmup over the first 5 % of the steps times a cosine decay to zero, over 20 shuffled epochs of batches of
  16 (`WorldSizes`); the learner builds fused AdamW from `LearnerConfig` with a linear warmup then a constant rate,
  one scheduler step per batch of groups, and skips non-finite updates;
- the forward: here a padded batch whose shared instruction-template prefix runs once, its keys/values expanded
  over the batch, and whose last layer runs past its keys/values only where a loss token is predicted
  (`world.lean`, the same function as `masked_logprobs`, transformers' own forward); the learner packs sequences into
  micro-batches under a token budget and takes chunked, temperature-scaled log-probs, another summation order;
- the process: the learner loads the policy from disk and shards it with FSDP2 over a `torch.distributed` world;
  the warm start trains a plain `Qwen2ForCausalLM` (after `copy_friendly_init` where asked) inside the world
  build's pinned child process (`python -m world`, `PINNED_ENV`, deterministic algorithms).
Any of these changes the weights a machine's build reproduces byte for byte, so every cached world would need a new
`WORLD_VERSION`, and the before-RL behaviour that `tests/integration/test_world_determinism.py` bounds and
docs/tiny-world.md reports would have to be measured again: all of it was measured with this loop, so it stays.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.progress import PhaseProgress
from tasks.search_r1.protocol import (
    answer_turn,
    format_documents,
    information_block,
    make_prompt_text,
    search_turn,
)
from world.kb import ATTRIBUTE_BY_KEY, KnowledgeBase, WorldSizes, passage_value
from world.lean import batch_tensors, lean_logprobs
from world.model import build_tiny_policy, train_tokenizer
from world.transfer import TRANSFER_EPOCHS, transferred_policy

if TYPE_CHECKING:
    import torch

    from retrieval.base import Hits

log = logging.getLogger(__name__)

TOKENIZER_S = 10  # about how long the tokenizer and the model take on a 2-core VM (the estimate shown)

# a batch of queries -> each query's top-3 documents ({"id", "contents"}), as the retrieval server ranks them
SearchFn = Callable[[list[str]], "list[Hits]"]


@dataclass(frozen=True)
class TextTrajectory:
    """One warm-start trajectory as text pieces; `sampled[i]` says whether piece i is the model's."""

    pieces: tuple[str, ...]
    sampled: tuple[bool, ...]
    good_query: bool


def build_trajectories(
    kb: KnowledgeBase, search: SearchFn, count: int, good_share: float, seed: int
) -> list[TextTrajectory]:
    """`count` trajectories over the train questions; a `good_share` of them search with the full name."""
    rng = random.Random(f"warmstart-{seed}")
    picks = [rng.choice(kb.train) for _ in range(count)]
    goods = [rng.random() < good_share for _ in range(count)]
    queries = [kb.good_query(q) if g else kb.imperfect_query(q) for q, g in zip(picks, goods, strict=True)]
    out = []
    for q, good, query, hits in zip(picks, goods, queries, search(queries), strict=True):
        pieces = (
            make_prompt_text(q.question),
            search_turn(ATTRIBUTE_BY_KEY[q.attribute].think, query),
            information_block(format_documents(hits.docs)),
            answer_turn(passage_value(kb.passage(hits.docs[0]["id"]), kb)),
        )
        out.append(TextTrajectory(pieces, (False, True, False, True), good))
    return out


def tokenizer_texts(kb: KnowledgeBase, trajectories: list[TextTrajectory]) -> list[str]:
    texts = [p.contents for p in kb.passages]
    texts += [make_prompt_text(q.question) for q in kb.train + kb.test]
    texts += ["".join(t.pieces[1:]) for t in trajectories]
    return texts


def tokenize_trajectory(tokenizer: Any, traj: TextTrajectory) -> tuple[list[int], list[int]]:
    """Token ids and loss mask, each piece tokenized on its own (token-level append, never re-encoding)."""
    ids: list[int] = []
    mask: list[int] = []
    for piece, sampled in zip(traj.pieces, traj.sampled, strict=True):
        piece_ids = tokenizer(piece, add_special_tokens=False).input_ids
        ids.extend(piece_ids)
        mask.extend([int(sampled)] * len(piece_ids))
    return ids, mask


# -- training ---------------------------------------------------------------------------------------------------


def common_prefix_length(seqs: list[list[int]]) -> int:
    """Number of leading tokens shared by every sequence (the instruction template of the prompts)."""
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        k = 0
        while k < n and s[k] == first[k]:
            k += 1
        n = k
    return n


def masked_logprobs(
    model: Any, seqs: list[tuple[list[int], list[int]]], pad_id: int, prefix_len: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the masked (model-sampled) tokens of `seqs`, and the row each one belongs to.

    The first `prefix_len` tokens, identical in every sequence (the instruction template), go through the model
    once and their keys/values are shared by the batch: the same values and gradients as full sequences, much
    cheaper. Logits are computed only where they are needed.
    """
    import torch
    from transformers import DynamicCache

    ids, attn, mask = batch_tensors(seqs, pad_id)
    batch = ids.shape[0]
    past = None
    if prefix_len > 0:
        prefix = model.model(input_ids=ids[:1, :prefix_len], use_cache=True).past_key_values
        past = DynamicCache(config=model.config)
        for i, layer in enumerate(prefix.layers):
            past.update(layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1), i)
    positions = torch.arange(prefix_len, ids.shape[1]).expand(batch, -1)
    hidden = model.model(
        input_ids=ids[:, prefix_len:],
        attention_mask=attn,
        position_ids=positions,
        past_key_values=past,
        use_cache=past is not None,
    ).last_hidden_state
    # token t is predicted at position t-1; the first token after the prefix is never a loss token (a prompt token)
    target_mask = mask[:, prefix_len + 1 :]
    logits = model.lm_head(hidden[:, :-1][target_mask]).float()
    targets = ids[:, prefix_len + 1 :][target_mask]
    logprobs = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    rows = torch.arange(batch)[:, None].expand_as(target_mask)[target_mask]
    return logprobs, rows


def shared_prefix_length(seqs: list[tuple[list[int], list[int]]]) -> int:
    """The template prefix shared by all `seqs`, cut before the first loss token."""
    first_loss = min((m.index(1) for _, m in seqs if 1 in m), default=0)
    return min(common_prefix_length([ids for ids, _ in seqs]), first_loss)


def sequence_loss(
    model: Any, seqs: list[tuple[list[int], list[int]]], pad_id: int, prefix_len: int = 0
) -> torch.Tensor:
    """Mean next-token cross-entropy over the masked tokens (what the warm start minimises)."""
    logprobs, _ = masked_logprobs(model, seqs, pad_id, prefix_len)
    return -logprobs.mean()


def sft(
    model: Any,
    seqs: list[tuple[list[int], list[int]]],
    pad_id: int,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    progress: bool = True,
    lean: bool = False,
) -> list[float]:
    """AdamW with linear warmup and cosine decay over `epochs`; returns the loss of every step. `lean`: the forward
    of `world.lean` (the same function, other rounding) instead of transformers' own."""
    import torch

    gen = random.Random(seed)
    steps_per_epoch = math.ceil(len(seqs) / batch_size)
    total = steps_per_epoch * epochs
    warmup = max(1, total // 20)
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
    )
    # the template prefix must stay outside the loss: cap it before the first sampled token
    prefix_len = shared_prefix_length(seqs)
    model.train()
    losses: list[float] = []
    # the world build reports its own time once, this step's included
    with PhaseProgress(
        "warm start", total=total, unit="steps", enabled=progress, report_done=False, announce=True
    ) as bar:
        for _ in range(epochs):
            order = list(range(len(seqs)))
            gen.shuffle(order)
            for start in range(0, len(order), batch_size):
                batch = [seqs[i] for i in order[start : start + batch_size]]
                if lean:
                    loss = -lean_logprobs(model, batch, pad_id, prefix_len)[0].mean()
                else:
                    loss = sequence_loss(model, batch, pad_id, prefix_len)
                optim.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optim.step()
                sched.step()
                losses.append(loss.item())
                bar.advance(note=f"loss {losses[-1]:.3f}")
    model.eval()
    return losses


def copy_friendly_init(model: Any) -> None:
    """Start the model able to copy a context token to the output, so the warm start only has to learn where to
    look (names from the question, the value from the first passage) rather than re-learn each token's identity.

    The output layer starts as a copy of the input embeddings (it stays untied), and the last layer's attention
    starts with value/output projections that pass the first `head_dim` embedding coordinates through unchanged
    (an identity OV circuit), so attending to a token raises that token's logit.
    """
    import torch

    attn = model.model.layers[-1].self_attn
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
        attn.v_proj.weight.zero_()
        if attn.v_proj.bias is not None:
            attn.v_proj.bias.zero_()
        for kv in range(cfg.num_key_value_heads):
            attn.v_proj.weight[kv * head_dim : (kv + 1) * head_dim, :head_dim] = torch.eye(head_dim)
        attn.o_proj.weight.zero_()
        for head in range(cfg.num_attention_heads):
            attn.o_proj.weight[:head_dim, head * head_dim : (head + 1) * head_dim] = torch.eye(head_dim)


def warm_start(
    kb: KnowledgeBase,
    trajectories: list[TextTrajectory],
    model_dir: Path,
    sizes: WorldSizes,
    *,
    seed: int = 0,
    progress: bool = True,
    base_dir: Path | None = None,
    base_kb: KnowledgeBase | None = None,
) -> int:
    """Train the tokenizer, build the model, fine-tune it on `trajectories` and save it (fp32 safetensors) into
    `model_dir`; returns the number of optimizer steps. With `base_dir` (a warm-started policy, trained on
    `base_kb`), the model starts from it instead of a random init (`world.transfer`) and trains `TRANSFER_EPOCHS`."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    torch.set_num_threads(2)
    torch.manual_seed(seed)
    model_dir = Path(model_dir)
    texts = tokenizer_texts(kb, trajectories)
    with PhaseProgress(
        "tiny world: the tokenizer and the model",
        expected_s=TOKENIZER_S,
        enabled=progress,
        report_done=False,
        announce=True,
    ):
        if base_dir is not None:
            if base_kb is None:
                raise ValueError(
                    "warm_start: base_dir needs base_kb, the knowledge base its policy was trained on"
                )
            train_tokenizer(texts, model_dir, vocab_size=sizes.vocab_size)
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            model = transferred_policy(base_dir, base_kb, tokenizer, kb)
            epochs = TRANSFER_EPOCHS
        else:
            build_tiny_policy(model_dir, texts, vocab_size=sizes.vocab_size, seed=seed, **sizes.model_shape)
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            if sizes.copy_init:
                copy_friendly_init(model)
            epochs = sizes.warmstart_epochs
    seqs = [tokenize_trajectory(tokenizer, t) for t in trajectories]
    losses = sft(
        model,
        seqs,
        tokenizer.pad_token_id,
        epochs=epochs,
        lr=sizes.warmstart_lr,
        batch_size=sizes.warmstart_batch,
        seed=seed,
        progress=progress,
        lean=sizes.lean_forward,
    )
    log.info("warm start: loss %.3f -> %.3f over %d steps", losses[0], losses[-1], len(losses))
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    return len(losses)
