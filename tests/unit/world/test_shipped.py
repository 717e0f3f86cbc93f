"""The default world ships in the package (world/shipped/seed0): installed by a copy, never stale, and made of what
the seed gives. The full rebuild of its warm start, compared with the shipped policy's behaviour, is
`tests/integration/test_world_determinism.py` (long tier)."""

from __future__ import annotations

import filecmp
import subprocess

import pyarrow.parquet as pq
import pytest

from world import MARKER_FILE, SHIPPED_DIR, WorldSizes, build_world, shipped_world
from world.kb import build_kb, write_corpus, write_questions


def test_the_shipped_world_is_built_by_this_recipe():
    assert shipped_world(0, WorldSizes()) == SHIPPED_DIR / "seed0", (
        "world/shipped/seed0 is not the world this WORLD_VERSION and these default sizes build: rebuild it with "
        "`python scripts/tiny_world.py --out world/shipped/seed0 --force --no-shipped --check` and commit it"
    )
    assert shipped_world(1, WorldSizes()) is None  # other seeds are built
    assert shipped_world(0, WorldSizes(num_people=200)) is None  # and other sizes


def test_the_default_world_is_installed_by_a_copy_not_built(tmp_path, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError(f"a build was started: {args}")

    monkeypatch.setattr(subprocess, "run", no_build)
    out = tmp_path / "seed0"
    world = build_world(out, seed=0, progress=False)
    for name in ("corpus.jsonl", "train.parquet", "test.parquet", MARKER_FILE, "model/model.safetensors"):
        assert filecmp.cmp(out / name, SHIPPED_DIR / "seed0" / name, shallow=False), name
    assert world.model_dir == out / "model"

    # a copy cut short (no marker yet) is copied again, whatever it left behind
    (out / MARKER_FILE).unlink()
    (out / "model" / "model.safetensors").write_bytes(b"torn")
    build_world(out, seed=0, progress=False)
    assert filecmp.cmp(
        out / "model/model.safetensors", SHIPPED_DIR / "seed0/model/model.safetensors", shallow=False
    )


def test_without_the_shipped_copy_the_world_is_built(tmp_path, monkeypatch):
    started = []

    def fake_build(cmd, **kwargs):
        started.append(cmd)
        raise RuntimeError("stop here")

    monkeypatch.setattr(subprocess, "run", fake_build)
    with pytest.raises(RuntimeError, match="stop here"):
        build_world(tmp_path / "seed0", seed=0, progress=False, shipped=False)
    assert started and started[0][1:3] == ["-m", "world"]


def test_the_shipped_corpus_and_questions_are_what_seed_0_gives(tmp_path):
    kb = build_kb(0, WorldSizes())
    write_corpus(kb, tmp_path / "corpus.jsonl")
    write_questions(kb.train, tmp_path / "train.parquet")
    write_questions(kb.test, tmp_path / "test.parquet")
    shipped = SHIPPED_DIR / "seed0"
    assert (tmp_path / "corpus.jsonl").read_bytes() == (shipped / "corpus.jsonl").read_bytes()
    for name in ("train.parquet", "test.parquet"):
        assert pq.read_table(tmp_path / name).to_pylist() == pq.read_table(shipped / name).to_pylist(), name
