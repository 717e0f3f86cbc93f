"""The tiny world is the same everywhere: a small build's corpus, questions, tokenizer and warm-started weights match
checksums committed here (computed on 2026-11-22 with torch 2.13.0 on an AVX-512 Xeon; the build pins the math
libraries to their AVX2 code paths and two threads, so any x86-64 machine with AVX2, Intel or AMD, with any number of
cores, must give the same; the same build on one core with OMP_NUM_THREADS=1 in the parent gave the same checksums).

Checksums are of content, not files: the questions' rows, the tokenizer's vocabulary and merges, each tensor's bytes
(so a newer pyarrow or tokenizers writing the same data differently does not matter; a newer torch or transformers
that initialises or rounds differently does, and the README says so)."""

from __future__ import annotations

import hashlib
import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SIZES = {"num_people": 60, "num_first_names": 12, "num_last_names": 20, "num_cities": 10, "num_test": 20,
         "num_warmstart": 200, "warmstart_epochs": 2}  # fmt: skip
EXPECTED = {
    "corpus": "cfbb343359fcc12eadf6d88bfd0be2f8ea7df7b636ce36797fb763736fd73416",
    "questions": "ba62ebb0eccc72c59d688ffd56f491270db8af23a55b5e264e27048757b01390",
    "tokenizer": "30ee2e33b0692505f30b159f5ec4f68b2aa06a45545f35b6c9eea80ed79c7db4",
    "weights": "71f660ab017acf93d8263ea09bd685287ec701bb894e974dc53e098ffa4f6967",
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def world_checksums(world) -> dict[str, str]:
    import pyarrow.parquet as pq
    from safetensors import safe_open

    rows = [pq.read_table(p).to_pylist() for p in (world.train_path, world.test_path)]
    tokenizer = json.loads((world.model_dir / "tokenizer.json").read_text())
    vocab = {"model": tokenizer["model"], "added": tokenizer["added_tokens"]}
    tensors = hashlib.sha256()
    with safe_open(world.model_dir / "model.safetensors", "pt") as f:
        for name in sorted(f.keys()):
            tensors.update(name.encode())
            tensors.update(f.get_tensor(name).contiguous().numpy().tobytes())
    return {
        "corpus": _sha(world.corpus_path.read_bytes()),
        "questions": _sha(json.dumps(rows, sort_keys=True).encode()),
        "tokenizer": _sha(json.dumps(vocab, sort_keys=True).encode()),
        "weights": tensors.hexdigest(),
    }


def test_a_small_world_matches_the_committed_checksums(tmp_path):
    from sr1.world import build_world

    world = build_world(tmp_path / "world", seed=5, progress=False, **SIZES)
    assert world_checksums(world) == EXPECTED
