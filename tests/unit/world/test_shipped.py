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


def test_another_seed_starts_its_warm_start_from_the_shipped_policy(tmp_path, monkeypatch):
    from world import transfer_base

    shipped_model = SHIPPED_DIR / "seed0" / "model"
    assert transfer_base(1, WorldSizes()) == shipped_model
    assert transfer_base(0, WorldSizes()) is None  # the shipped world itself starts from a random init
    assert transfer_base(1, WorldSizes(num_people=200)) is None  # so does any other size

    started = []

    def fake_build(cmd, **kwargs):
        started.append(cmd)
        raise RuntimeError("stop here")

    monkeypatch.setattr(subprocess, "run", fake_build)
    for shipped in (True, False):
        with pytest.raises(RuntimeError, match="stop here"):
            build_world(tmp_path / "seed1", seed=1, progress=False, shipped=shipped)
    # the child builds from the shipped policy unless told not to
    assert ["--no-shipped" in cmd for cmd in started] == [False, True]


def test_a_world_built_before_the_transfer_is_built_again(tmp_path, monkeypatch):
    """A cached world of another seed whose marker does not say it started from the shipped policy (a from-scratch
    build, or one of an older recipe) is not what `build_world` would build now: it is rebuilt, not reused."""
    import dataclasses
    import json

    from world import WORLD_VERSION

    out = tmp_path / "seed1"
    for name in ("corpus.jsonl", "train.parquet", "test.parquet"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("x")
    (out / "model").mkdir()
    scratch = {"version": WORLD_VERSION, "seed": 1, "sizes": dataclasses.asdict(WorldSizes())}
    (out / MARKER_FILE).write_text(json.dumps(scratch))
    started = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: started.append(cmd))
    with pytest.raises(RuntimeError, match="without its marker"):
        build_world(out, seed=1, progress=False)
    assert len(started) == 1
    # the same marker is what a build from a random init writes: with `shipped=False` it is found as built
    (out / MARKER_FILE).write_text(json.dumps(scratch))
    build_world(out, seed=1, progress=False, shipped=False)
    assert len(started) == 1
