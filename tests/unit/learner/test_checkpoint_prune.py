"""Pruning after a fallback resume keeps the checkpoint resumed from, deletes nothing in place and clears what a
crash left; the RNG state loads without running code (learner/checkpoints/checkpointer.py,
learner/checkpoints/files.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fakes.groups import random_groups
from learner.checkpoints.checkpointer import Checkpointer, CheckpointLoadError, ResumeState
from learner.checkpoints.files import MANIFEST, checksum_files, files_under, read_manifest, write_manifest
from learner.settings import LearnerConfig
from learner.trainer import Learner


@pytest.fixture(scope="module")
def trained(world, tiny_model_dir):
    """A learner one step in (so AdamW has state to save)."""
    learner = Learner(LearnerConfig(groups_per_step=2, micro_batch_tokens=512), tiny_model_dir, world)
    learner.train_step(random_groups(np.random.default_rng(0), n_groups=2, group_size=2, version=0))
    return learner


def _save(ckpt: Checkpointer, learner: Learner, version: int) -> Path:
    return ckpt.save(learner.model, learner.optimizer, learner.scheduler, ResumeState(version=version))


def _resume(ckpt: Checkpointer, world, tiny_model_dir):
    fresh = Learner(LearnerConfig(groups_per_step=2, micro_batch_tokens=512), tiny_model_dir, world)
    return ckpt.resume(fresh.model, fresh.optimizer, fresh.scheduler)


def _flip_a_byte(checkpoint: Path) -> None:
    """Same size, one byte changed: it looks complete (sizes) and fails verification (CRC-32)."""
    with open(checkpoint / "model.safetensors", "r+b") as f:
        f.seek(-10, 2)
        byte = f.read(1)
        f.seek(-10, 2)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_checkpoints_that_failed_verification_do_not_count_toward_keep(
    world, trained, tiny_model_dir, tmp_path
):
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, keep=3)
    for version in (4, 8, 12):
        _save(ckpt, trained, version)
    _flip_a_byte(ckpt.root / "step_8")
    _flip_a_byte(ckpt.root / "step_12")
    restarted = Checkpointer(ckpt.root, world, tiny_model_dir, keep=2)  # the learner restarts
    resumed = _resume(restarted, world, tiny_model_dir)
    assert resumed.path.name == "step_4" and [name for name, _ in resumed.skipped] == ["step_12", "step_8"]
    _save(restarted, trained, 5)  # the run goes on from step 4
    # keep=2: step_5 and step_4, the newest that verified; the corrupt ones do not stand in for it
    names = sorted(p.name for p in restarted.root.glob("step_*"))
    assert {"step_4", "step_5"} <= set(names)
    _save(restarted, trained, 8)  # step_8 written again (good now): it counts
    _save(restarted, trained, 9)
    assert sorted(p.name for p in restarted.root.glob("step_*")) == ["step_12", "step_8", "step_9"]


def test_prune_renames_a_checkpoint_aside_before_deleting_it(
    world, trained, tiny_model_dir, tmp_path, monkeypatch
):
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, keep=1)
    old = _save(ckpt, trained, 1)
    deleted: list[tuple[str, bool]] = []
    rmtree = shutil.rmtree

    def watched(path, *args, **kwargs):
        deleted.append((Path(path).name, old.exists()))
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", watched)
    _save(ckpt, trained, 2)
    assert not old.exists() and deleted
    assert all(not name.startswith("step_") for name, _ in deleted)  # never deleted under its own name
    assert (".step_1.stale", False) in deleted  # step_1 was gone from the listing before its files went
    assert sorted(p.name for p in ckpt.root.iterdir()) == ["latest", "step_2"]


def test_stale_leftovers_are_cleared_at_start_and_at_prune(world, trained, tiny_model_dir, tmp_path):
    root = tmp_path / "checkpoints"
    (root / ".step_3.stale" / "resume").mkdir(parents=True)  # a removal a crash interrupted
    (root / ".step_3.stale" / "model.safetensors").write_bytes(b"\0" * 1024)
    ckpt = Checkpointer(root, world, tiny_model_dir, keep=1)
    assert not (root / ".step_3.stale").exists()
    _save(ckpt, trained, 1)
    (root / ".step_0.stale").mkdir()  # left by another process after this one started
    _save(ckpt, trained, 2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_2"]


class _Touch:
    """Unpickles as `Path(marker).touch()`: what a planted file could run instead (any callable, any argument)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_an_rng_state_that_would_run_code_is_not_loaded(world, trained, tiny_model_dir, tmp_path):
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir)
    path = _save(ckpt, trained, 1)
    marker = tmp_path / "code-ran"
    rng = path / "resume" / "rng_rank0.pt"
    state = torch.load(rng, weights_only=True)  # what sr1 writes loads with the weights-only unpickler
    torch.save({**state, "planted": _Touch(marker)}, rng)
    entries, body = read_manifest(
        path
    )  # a manifest that matches, as someone who planted the file would write
    write_manifest(path, checksum_files(path, files_under(path)), version=body["version"])
    assert (path / MANIFEST).is_file() and entries.keys() == checksum_files(path, files_under(path)).keys()
    with pytest.raises(CheckpointLoadError, match="does not load"):
        _resume(Checkpointer(ckpt.root, world, tiny_model_dir), world, tiny_model_dir)
    assert not marker.exists()
