"""A new seed's policy started from the shipped seed-0 policy: its word rows renamed to the new seed's words.

A seed's own tokenizer makes each of its names and cities one token (a byte-level BPE trained on its corpus), so the
shipped policy's protocol, query and answer-copy circuits work on token identities it has seen: under seed 0's
tokenizer another seed's names take three to four tokens each, and the shipped policy used as is answers almost
nothing there. Started instead from the shipped weights with each embedding and output row moved to the token of
the new seed's corresponding word (the i-th first name, last name, city of one seed onto the i-th of the other, both
in sorted order), every other token onto the shipped token of the same string, and the few left (pieces of the new
seed's words, never a whole one) onto the mean row, the policy already speaks the protocol and copies the new names; two epochs of
the warm start on the seed's own trajectories (`TRANSFER_EPOCHS`) then give the behaviour the shipped world has, at a
tenth of a from-scratch warm start's steps. `build_world` does it for any seed but 0 whose sizes are the shipped
world's; everything is copied or indexed, so a machine builds the same bytes every time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from world.kb import KnowledgeBase

# warm-start epochs after the transfer (250 steps at the default sizes); one left RL less room on two of five seeds
# (docs/measurements/tiny-world-2026-11-28.md)
TRANSFER_EPOCHS = 2


def words(kb: KnowledgeBase) -> tuple[list[str], list[str], list[str]]:
    """The knowledge base's first names, last names and cities, each sorted: the words a transfer pairs up."""
    return (
        sorted({p.first for p in kb.people}),
        sorted({p.last for p in kb.people}),
        sorted(set(kb.cities)),
    )


def row_sources(
    base_tokenizer: Any, base_kb: KnowledgeBase, tokenizer: Any, kb: KnowledgeBase
) -> dict[int, int]:
    """For each token of `tokenizer` that has one, the `base_tokenizer` token whose rows it starts from."""

    def single(tok: Any, text: str) -> int | None:
        ids = tok(text, add_special_tokens=False).input_ids
        return ids[0] if len(ids) == 1 else None

    sources: dict[int, int] = {}
    for base_words, new_words in zip(words(base_kb), words(kb), strict=True):
        for base_word, new_word in zip(base_words, new_words, strict=False):
            for lead in (" ", ""):  # after a space (questions, passages) and without (after a quote, a tag)
                new, base = single(tokenizer, lead + new_word), single(base_tokenizer, lead + base_word)
                if new is not None and base is not None:
                    sources.setdefault(new, base)
    base_vocab = base_tokenizer.get_vocab()
    for text, new in tokenizer.get_vocab().items():
        if new not in sources and text in base_vocab:
            sources[new] = base_vocab[text]
    return sources


def transferred_policy(base_dir: Path, base_kb: KnowledgeBase, tokenizer: Any, kb: KnowledgeBase) -> Any:
    """The `Qwen2ForCausalLM` in `base_dir` (the shipped policy, trained on `base_kb`) with its embedding and output
    rows moved to `tokenizer`'s tokens for `kb` (see module); every other weight as it is."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    base = Qwen2ForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    sources = row_sources(AutoTokenizer.from_pretrained(base_dir), base_kb, tokenizer, kb)
    size = len(tokenizer)
    new_ids = sorted(sources)
    base_ids = [sources[i] for i in new_ids]
    state = base.state_dict()
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = state[key]
        moved = rows.mean(0, keepdim=True).repeat(size, 1)  # the rows no token of the base gives
        moved[new_ids] = rows[base_ids]
        state[key] = moved
    config = base.config
    config.vocab_size = size
    config.pad_token_id, config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    config.bos_token_id = tokenizer.eos_token_id
    model = Qwen2ForCausalLM(config)
    model.load_state_dict(state)
    return model
