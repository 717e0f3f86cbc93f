"""A tiny Qwen2 policy built offline: a byte-level BPE tokenizer trained on the fly and a random-init model.

Used by the tests (a few-hundred-KB model every part can load: transformers, vLLM, FSDP2) and by the tiny world of
`sr1 run`, which then gives it a supervised warm start. The Search-R1 protocol tags are single, non-special tokens,
so stop strings match inside vLLM and decoded text keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PROTOCOL_TAGS = [
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
]
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def train_tokenizer(texts: Iterable[str], out_dir: Path, vocab_size: int = 2048) -> Path:
    """Train a byte-level BPE tokenizer on `texts` and save it in HF format into `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    fast.add_tokens(PROTOCOL_TAGS)  # regular (non-special) tokens: they survive decoding
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return out_dir


def build_model(
    tokenizer_dir: Path,
    out_dir: Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 256,
    max_positions: int = 1024,
    seed: int = 0,
) -> Path:
    """Save a random-init `Qwen2ForCausalLM` sized to the tokenizer (fp32 safetensors) plus the tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def build_tiny_policy(
    out_dir: Path, texts: Iterable[str], *, vocab_size: int = 2048, seed: int = 0, **model_kwargs
) -> Path:
    """Tokenizer + random model in one directory, ready for transformers and vLLM."""
    train_tokenizer(texts, out_dir, vocab_size=vocab_size)
    return build_model(out_dir, out_dir, seed=seed, **model_kwargs)
