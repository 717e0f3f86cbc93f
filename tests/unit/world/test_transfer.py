"""`world.transfer`: another seed's policy starts from the shipped seed-0 one, each word's rows moved to the token of
the word it is paired with, every other token's rows to the shipped token of the same string."""

from __future__ import annotations

import pytest

from world import SHIPPED_DIR, WorldSizes
from world.kb import build_kb
from world.model import PROTOCOL_TAGS, train_tokenizer
from world.transfer import row_sources, transferred_policy, words

SHIPPED_MODEL = SHIPPED_DIR / "seed0" / "model"


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    from transformers import AutoTokenizer

    base_kb, kb = build_kb(0, WorldSizes()), build_kb(1, WorldSizes())
    out = tmp_path_factory.mktemp("seed1_tokenizer")
    texts = [p.contents for p in kb.passages] + [q.question for q in kb.train + kb.test]
    train_tokenizer(texts, out, vocab_size=WorldSizes().vocab_size)
    return base_kb, AutoTokenizer.from_pretrained(SHIPPED_MODEL), kb, AutoTokenizer.from_pretrained(out)


def one_token(tokenizer, text: str) -> int:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_each_word_takes_the_rows_of_the_word_it_is_paired_with(seeds):
    base_kb, base_tok, kb, tok = seeds
    sources = row_sources(base_tok, base_kb, tok, kb)
    pairs = 0
    for base_words, new_words in zip(words(base_kb), words(kb), strict=True):
        # the i-th with the i-th; a seed's people may use a few last names fewer than another's
        for base_word, new_word in zip(base_words, new_words, strict=False):
            assert sources[one_token(tok, " " + new_word)] == one_token(base_tok, " " + base_word)
            pairs += 1
    assert pairs >= 0.95 * sum(map(len, words(kb)))
    # another seed's names are not words of the shipped tokenizer: that is why the rows move
    assert len(base_tok(" " + words(kb)[0][0], add_special_tokens=False).input_ids) > 1
    for text in PROTOCOL_TAGS + [tok.eos_token, tok.pad_token, " the", " city"]:
        assert sources[one_token(tok, text)] == one_token(base_tok, text), text


def test_the_transferred_policy_has_the_moved_rows_and_the_shipped_layers(seeds):
    import torch
    from transformers import Qwen2ForCausalLM

    base_kb, base_tok, kb, tok = seeds
    base = Qwen2ForCausalLM.from_pretrained(SHIPPED_MODEL, dtype=torch.float32)
    model = transferred_policy(SHIPPED_MODEL, base_kb, tok, kb)
    assert model.config.vocab_size == len(tok) and model.get_input_embeddings().weight.shape[0] == len(tok)
    sources = row_sources(base_tok, base_kb, tok, kb)
    city = one_token(tok, " " + words(kb)[2][0])
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        new, old = model.state_dict()[name], base.state_dict()[name]
        assert torch.equal(new[city], old[sources[city]])
        unmapped = [i for i in range(len(tok)) if i not in sources]
        assert unmapped and torch.allclose(new[unmapped[0]], old.mean(0))
    layer = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(model.state_dict()[layer], base.state_dict()[layer])
