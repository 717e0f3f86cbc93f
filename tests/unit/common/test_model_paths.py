"""Model paths: a directory as it is, a hub id from the local Hugging Face cache, clear errors otherwise."""

from __future__ import annotations

import pytest

from common.model_paths import ModelPathError, resolve_model_path, resolve_tokenizer_path
from common.sections import ModelConfig


def _cached_snapshot(cache, repo_id: str, revision: str = "0123456789abcdef0123456789abcdef01234567"):
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<sha>/...}."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def test_a_directory_is_taken_as_it_is(tmp_path):
    assert resolve_model_path(tmp_path) == tmp_path


def test_a_hub_id_resolves_to_its_cached_snapshot_offline(tmp_path):
    snapshot = _cached_snapshot(tmp_path / "hub", "Qwen/Qwen2.5-3B-Instruct")
    assert resolve_model_path("Qwen/Qwen2.5-3B-Instruct", cache_dir=tmp_path / "hub") == snapshot


def test_a_hub_id_missing_from_the_cache_names_the_id_and_the_cache(tmp_path):
    with pytest.raises(
        ModelPathError,
        match=r"'Qwen/Qwen2.5-7B' is not a directory and not in the Hugging Face "
        r"cache at .*hub.*huggingface-cli download Qwen/Qwen2.5-7B",
    ):
        resolve_model_path("Qwen/Qwen2.5-7B", cache_dir=tmp_path / "hub")


def test_neither_a_directory_nor_a_hub_id(tmp_path):
    with pytest.raises(ModelPathError, match="model.tokenizer_path 'no/such/dir' is not a directory"):
        resolve_model_path("no/such/dir", what="model.tokenizer_path")
    with pytest.raises(ModelPathError, match="embedded model: only `sr1 run`"):
        resolve_model_path("tiny")


def test_the_tokenizer_is_the_models_own_unless_a_tokenizer_path_is_given(tmp_path):
    model, tokenizer = tmp_path / "model", tmp_path / "tokenizer"
    model.mkdir()
    tokenizer.mkdir()
    assert resolve_tokenizer_path(ModelConfig(path=str(model))) == model
    assert resolve_tokenizer_path(ModelConfig(path=str(model), tokenizer_path=str(tokenizer))) == tokenizer
    with pytest.raises(ModelPathError, match="model.tokenizer_path 'no/such/dir' is not a directory"):
        resolve_tokenizer_path(ModelConfig(path=str(model), tokenizer_path="no/such/dir"))
