"""Checkpoints are written atomically with a manifest, verified before they are loaded, and a full disk during a
write leaves the previous checkpoints as they were (learner/checkpoints/checkpointer.py,
learner/checkpoints/files.py)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from fakes.groups import random_groups
from learner.checkpoints.checkpointer import (
    LATEST,
    Checkpointer,
    CheckpointLoadError,
    CheckpointWriteError,
    ResumeState,
    latest_checkpoint,
)
from learner.checkpoints.files import (
    DISK_FULL_ENV,
    MANIFEST,
    files_under,
    read_manifest,
    storage_error,
    verify_files,
)
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


def _weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() for k, v in learner.model.state_dict().items()}


def test_a_checkpoint_lists_every_file_with_its_size_and_checksum(world, trained, tiny_model_dir, tmp_path):
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir)
    path = _save(ckpt, trained, 1)
    entries, body = read_manifest(path)
    assert sorted(entries) == files_under(path)  # every file but the manifest itself
    assert {"model.safetensors", "config.json", "resume/state.json", "resume/rng_rank0.pt"} <= set(entries)
    assert any(p.startswith("resume/dcp/") for p in entries)
    assert body["total_bytes"] == sum(e.size for e in entries.values()) and body["checksum"] == "crc32"
    assert verify_files(path, entries.values()) == []
    assert (ckpt.root / LATEST).read_text() == "step_1" and latest_checkpoint(ckpt.root) == path
    assert [p.name for p in ckpt.root.iterdir() if p.name.startswith(".")] == []  # nothing partial left


def test_a_full_disk_removes_the_partial_files_and_keeps_the_last_good_checkpoint(
    world, trained, tiny_model_dir, tmp_path, monkeypatch
):
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, keep=1)
    good = _save(ckpt, trained, 4)
    before = sorted((p, p.stat().st_size) for p in good.rglob("*"))
    trigger = tmp_path / "disk-full"
    trigger.write_text("40000")  # part of the safetensors file gets written, then ENOSPC
    monkeypatch.setenv(DISK_FULL_ENV, str(trigger))
    with pytest.raises(CheckpointWriteError, match="No space left on device") as caught:
        _save(ckpt, trained, 8)
    assert caught.value.no_space
    assert sorted(p.name for p in ckpt.root.iterdir()) == [
        LATEST,
        "step_4",
    ]  # no step_8, no partial directory
    assert sorted((p, p.stat().st_size) for p in good.rglob("*")) == before
    assert (ckpt.root / LATEST).read_text() == "step_4"
    needed, source = ckpt.space_needed(trained.model)
    assert needed == read_manifest(good)[1]["total_bytes"] and source == "the size of step_4"
    # space again: the next save succeeds, and only then is step_4 pruned (keep=1)
    trigger.unlink()
    _save(ckpt, trained, 12)
    assert sorted(p.name for p in ckpt.root.iterdir()) == [LATEST, "step_12"]


def test_resume_skips_a_torn_or_corrupt_checkpoint_and_loads_the_newest_good_one(
    world, trained, tiny_model_dir, tmp_path, caplog
):
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, keep=3)
    _save(ckpt, trained, 4)
    expected = _weights(trained)
    trained.train_step(random_groups(np.random.default_rng(1), n_groups=2, group_size=2, version=1))
    torn = _save(ckpt, trained, 8)
    corrupt = _save(ckpt, trained, 12)
    size = (torn / "model.safetensors").stat().st_size
    os.truncate(torn / "model.safetensors", size // 2)  # as a node that died mid-write leaves it
    (shard,) = (corrupt / "resume" / "dcp").glob("__0_*.distcp")
    with open(shard, "r+b") as f:  # same size, one byte flipped
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))

    fresh = Learner(LearnerConfig(groups_per_step=2, micro_batch_tokens=512), tiny_model_dir, world)
    resumed = ckpt.resume(fresh.model, fresh.optimizer, fresh.scheduler)
    assert resumed.path.name == "step_4" and resumed.state.version == 4
    (corrupt_name, corrupt_why), (torn_name, torn_why) = resumed.skipped
    assert corrupt_name == "step_12" and "CRC-32" in corrupt_why and shard.name in corrupt_why
    assert torn_name == "step_8" and f"model.safetensors has {size // 2} bytes" in torn_why
    assert "cut short" in torn_why
    assert "skipping checkpoint" in caplog.text and "resuming from step_4" in caplog.text
    for name, tensor in _weights(fresh).items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0)
    assert latest_checkpoint(ckpt.root) == corrupt  # sizes alone (no read) cannot see a flipped byte


def test_no_usable_checkpoint_is_an_error_naming_each_one(world, trained, tiny_model_dir, tmp_path):
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir)
    first, second = _save(ckpt, trained, 1), _save(ckpt, trained, 2)
    (first / MANIFEST).unlink()
    (first / "resume" / "state.json").unlink()  # no manifest and no resume state: not a checkpoint of any age
    (second / MANIFEST).write_text('{"files": ')
    fresh = Learner(LearnerConfig(groups_per_step=2, micro_batch_tokens=512), tiny_model_dir, world)
    with pytest.raises(CheckpointLoadError) as caught:
        ckpt.resume(fresh.model, fresh.optimizer, fresh.scheduler)
    message = str(caught.value)
    assert f"step_2: {MANIFEST} is unreadable" in message and f"step_1: no {MANIFEST}" in message
    # and with no checkpoint at all there is nothing to resume from, which is no error
    assert (
        Checkpointer(tmp_path / "none", world, tiny_model_dir).resume(fresh.model, fresh.optimizer, None).path
        is None
    )


def test_a_checkpoint_without_a_manifest_that_does_not_load_is_skipped(
    world, trained, tiny_model_dir, tmp_path
):
    """Checkpoints written before manifests existed are loaded unverified; one that fails to load (the torn step_8
    of issue 41) is skipped like one that fails its verification, not retried."""
    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir, keep=2)
    for version in (4, 8):
        (_save(ckpt, trained, version) / MANIFEST).unlink()
    for path in (ckpt.root / "step_8").rglob("*"):
        if path.is_file() and path.stat().st_size > 4096:
            os.truncate(path, path.stat().st_size // 2)
    fresh = Learner(LearnerConfig(groups_per_step=2, micro_batch_tokens=512), tiny_model_dir, world)
    resumed = ckpt.resume(fresh.model, fresh.optimizer, fresh.scheduler)
    assert resumed.path.name == "step_4"
    ((name, why),) = resumed.skipped
    assert name == "step_8" and why.startswith("its files verify but it does not load")


def test_a_write_error_inside_torch_distributed_checkpoint_is_a_storage_failure(
    world, trained, tiny_model_dir, tmp_path, monkeypatch
):
    """DCP wraps each rank's exception in a CheckpointException (a BaseException): the OSError inside is found."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    real = FileSystem.create_stream

    def full(self, path, mode):
        if str(path).endswith(".distcp"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(self, path, mode)

    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir)
    monkeypatch.setattr(FileSystem, "create_stream", full)
    with pytest.raises(CheckpointWriteError) as caught:
        _save(ckpt, trained, 3)
    assert caught.value.no_space and not list(ckpt.root.glob("*step_3*"))


def test_storage_error_finds_the_oserror_behind_a_failure():
    inner = OSError(errno.EDQUOT, "Disk quota exceeded")
    try:
        try:
            raise inner
        except OSError as err:
            raise RuntimeError("file write failed") from err
    except RuntimeError as outer:
        assert storage_error(outer) is inner
    assert storage_error(ValueError("a bug")) is None


def _can_mount_tmpfs(where: Path) -> bool:
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if done.returncode == 0:
        subprocess.run(["umount", str(where)], check=True)
    return done.returncode == 0


def test_a_real_full_filesystem(world, trained, tiny_model_dir, tmp_path):
    """The same on a size-limited tmpfs (needs the right to mount: root with CAP_SYS_ADMIN): the disk fills up in
    torch.distributed.checkpoint's shards, after the safetensors weights fit."""
    if shutil.which("mount") is None or not _can_mount_tmpfs(tmp_path / "probe"):
        pytest.skip("mounting a tmpfs is not permitted here; the injected-ENOSPC tests above cover the logic")
    ckpt_dir = tmp_path / "small"
    probe = Checkpointer(tmp_path / "probe-save", world, tiny_model_dir)
    hf_bytes = (_save(probe, trained, 1) / "model.safetensors").stat().st_size
    ckpt_dir.mkdir()
    limit = hf_bytes + (1 << 20)  # the weights and model files fit, the fp32 weights and AdamW moments do not
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={limit}", "tmpfs", str(ckpt_dir)], check=True)
    try:
        ckpt = Checkpointer(ckpt_dir, world, tiny_model_dir)
        with pytest.raises(CheckpointWriteError) as caught:
            _save(ckpt, trained, 2)
        assert caught.value.no_space and "no space left on device" in str(caught.value).lower()
        assert list(ckpt_dir.iterdir()) == []  # the partial directory went, and with it every byte it held
        stat = os.statvfs(ckpt_dir)
        assert stat.f_bfree == stat.f_blocks
    finally:
        subprocess.run(["umount", str(ckpt_dir)], check=True)


def test_one_failed_checkpoint_goes_on_and_the_second_in_a_row_stops_saying_what_space_it_needs(
    world, trained, tiny_model_dir, tmp_path
):
    from learner.checkpoints.safety_net import CheckpointsFailing, SafetyNet

    ckpt = Checkpointer(tmp_path / "checkpoints", world, tiny_model_dir)
    estimate, source = ckpt.space_needed(trained.model)  # no checkpoint yet: from the parameters
    params = sum(p.numel() for p in trained.model.parameters())
    assert source == "estimated from the model's parameters" and estimate > 12 * params
    net = SafetyNet(ckpt, last_good=None)
    full = CheckpointWriteError("the checkpoint of step 2 could not be written (no space)", no_space=True)
    net.failed(full, version=2, model=trained.model)  # the first: logged, training goes on
    assert net.metrics() == {"checkpoint/failed_in_a_row": 1.0, "checkpoint/last_good_step": 0.0}
    assert "There is no good checkpoint yet" in net.last_failure and "needs about" in net.last_failure
    net.saved(4)
    assert net.metrics() == {"checkpoint/failed_in_a_row": 0.0, "checkpoint/last_good_step": 4.0}
    _save(ckpt, trained, 4)
    net.failed(full, version=6, model=trained.model)
    with pytest.raises(
        CheckpointsFailing, match=r"2 checkpoints in a row could not be written \(step 6, step 8\)"
    ):
        net.failed(full, version=8, model=trained.model)
    assert (
        "The last good checkpoint is step_4" in net.last_failure
        and "(the size of step_4;" in net.last_failure
    )
    net.failed(
        full, version=10, model=trained.model, last=True
    )  # the run's last one is retried, never raised
    other = CheckpointWriteError("the checkpoint of step 12 could not be written (EIO)", no_space=False)
    net.failed(other, version=12, model=trained.model, last=True)
    assert "needs about" not in net.last_failure and "Fix the storage under" in net.last_failure
