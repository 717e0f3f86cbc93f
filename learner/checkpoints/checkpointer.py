"""Checkpoints: an HF directory transformers and vLLM load directly, plus the state to resume the run.

    <run_dir>/checkpoints/step_<N>/
        model.safetensors | model-0000k-of-0000n.safetensors + model.safetensors.index.json
        config.json, generation_config.json, tokenizer files          (copied from the model directory)
        resume/dcp/        torch.distributed.checkpoint: each rank writes its own shards of the fp32 parameters and
                           AdamW state (no gather; reloads under another world size too), and PPO's critic's
        resume/rng_rank<r>.pt   each rank's torch RNG state and learning-rate schedules
        resume/state.json  version, data cursor, groups used since the previous checkpoint (acked at resume)
        sr1-manifest.json  every file's size and CRC-32 (learner/checkpoints/files.py)
        adapter/           learner.lora: the PEFT adapter; DCP holds it and its AdamW state, the merged model is exported
    <run_dir>/checkpoints/.step_<N>.partial/   the same while it is written; renamed to step_<N> once complete
    <run_dir>/checkpoints/.step_<N>.stale/     a checkpoint being deleted: renamed aside first, so no step_<N> is
                                               ever half-deleted (leftovers of a crash are cleared at start and prune)
    <run_dir>/checkpoints/latest               name of the newest complete checkpoint (written last)

Saving (every rank): rank 0 streams the HF weights (learner/checkpoints/hf_weights.py) and copies the model's files,
every rank writes its DCP shards and RNG state and checksums the files it wrote, then rank 0 writes the manifest,
fsyncs the directory tree, renames the directory to `step_<N>` and points `latest` at it; only then are older
checkpoints pruned (`keep`: the newest good ones, the one just written among them; one that `resume` skipped does not
count, so after a fallback resume the next prune keeps the checkpoint it resumed from). The ranks agree after each
phase (one all-gather): when any rank failed to write (no space, an I/O error), every rank raises
`CheckpointWriteError`, the partial directory is removed, and the previous checkpoints are as they were.

Resuming (`resume`): the newest `step_<N>` whose files match their manifest (each rank checksums a share) and load
is used; each one skipped is named with why. None left: `CheckpointLoadError` (deterministic: not worth a restart).
"""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from learner.checkpoints.adapters import check_resumable, save_weights, state_dict_options
from learner.checkpoints.files import (
    MANIFEST,
    ManifestError,
    WriteBudget,
    atomic_write_text,
    check_sizes,
    checksum_files,
    clear_stale,
    files_under,
    fsync_dir,
    fsync_tree,
    is_no_space,
    read_manifest,
    remove_tree,
    storage_error,
    verify_files,
    write_durably,
    write_manifest,
)
from learner.checkpoints.hf_weights import copy_hf_files, hf_weight_bytes
from learner.distributed import World, all_gather_objects
from learner.model import DTYPES
from learner.settings import LoraSettings

log = logging.getLogger(__name__)

LATEST = "latest"
_STEP_DIR = re.compile(r"step_(\d+)")
_RANK_FILE = re.compile(r"resume/(?:dcp/__(\d+)_\d+\.distcp|rng_rank(\d+)\.pt)$")
# a write that fails with less than this left on the filesystem failed for lack of space, whatever it raised
LOW_SPACE_BYTES = 64 << 20
# bytes per parameter of the resume state: fp32 weights and AdamW's two fp32 moments
_RESUME_BYTES_PER_PARAM = 12


@dataclass
class ResumeState:
    version: int
    cursor: int = 0  # prompts the feeder has taken from the dataset
    used_group_entries: list[str] = field(
        default_factory=list
    )  # groups in steps since the previous checkpoint
    consumed_groups: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    used_group_ids: list[str] = field(default_factory=list)  # the same groups' ids (empty before manifests)


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (no space, an I/O error) on some rank: its partial files were removed and
    the checkpoints before it are untouched. `no_space` when a disk (or quota) was full."""

    def __init__(self, message: str, no_space: bool):
        super().__init__(message)
        self.no_space = no_space


class CheckpointLoadError(RuntimeError):
    """No checkpoint of the run could be loaded: each one failed its verification or its load. The same files fail
    the same way again, so a restart cannot help."""


@dataclass
class Resumed:
    """What `Checkpointer.resume` found: the checkpoint loaded (None: there was none) and those it skipped."""

    path: Path | None
    state: ResumeState | None
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why)


def step_of(path: Path) -> int | None:
    match = _STEP_DIR.fullmatch(path.name)
    return int(match.group(1)) if match else None


def checkpoint_dirs(root: Path) -> list[Path]:
    """Every `step_<N>` directory under `root`, newest first (complete or not: see `looks_complete`)."""
    found = [p for p in Path(root).glob("step_*") if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=step_of, reverse=True)


def looks_complete(path: Path) -> bool:
    """A cheap check, no file read: a manifest whose files all have their sizes, or a checkpoint written before
    manifests existed that has its resume state."""
    try:
        entries, _ = read_manifest(path)
    except ManifestError:
        return not (path / MANIFEST).exists() and (path / "resume" / "state.json").is_file()
    return not check_sizes(path, entries.values())


def latest_checkpoint(root: Path) -> Path | None:
    """The newest checkpoint under `root` that looks complete (sizes as in its manifest), or None."""
    return next((p for p in checkpoint_dirs(root) if looks_complete(p)), None)


def checkpoint_bytes(path: Path) -> int | None:
    """The size of a checkpoint as its manifest records it (None without one)."""
    try:
        return int(read_manifest(path)[1].get("total_bytes", 0)) or None
    except ManifestError:
        return None


def _describe(err: BaseException) -> str:
    # torch.distributed.checkpoint's CheckpointException carries each failing rank's own exception
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        err = first[0] if isinstance(first, tuple) else first
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:400]


class Checkpointer:
    def __init__(
        self,
        root: Path,
        world: World,
        model_dir: Path,
        save_dtype: str = "float32",
        keep: int = 2,
        tokenizer_dir: Path | None = None,
        lora: LoraSettings | None = None,
    ):
        self.root = Path(root)
        self.lora = lora  # learner.lora: the adapters (PEFT layout) and their optimizer state only
        self.world = world
        self.model_dir = Path(model_dir)
        self.tokenizer_dir = None if tokenizer_dir is None else Path(tokenizer_dir)
        self.save_dtype = save_dtype
        self.keep = keep
        # checkpoints `resume` skipped (failed verification or load): prune does not count them toward `keep`
        self.failed: set[str] = set()
        if world.is_main and self.root.is_dir():
            for partial in self.root.glob(".step_*.partial"):  # a save a crash interrupted
                log.warning("removing %s: a checkpoint that was never completed", partial)
                shutil.rmtree(partial, ignore_errors=True)
            for stale in clear_stale(self.root):
                log.warning("removed %s: a checkpoint whose removal a crash interrupted", stale)

    def latest(self) -> Path | None:
        return latest_checkpoint(self.root)

    # -- saving ---------------------------------------------------------------------------------------------------

    def save(self, model, optimizer, scheduler, state: ResumeState, critic=None, export=False) -> Path:
        """Every rank calls this. Returns the checkpoint directory, complete and renamed into place; raises
        CheckpointWriteError (on every rank) when a rank could not write its part. `critic` (learner/critic.py) is
        saved with the policy's resume state; with LoRA, the merged model only to `export`."""
        from torch.distributed.checkpoint import save as dcp_save
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import get_state_dict

        world = self.world
        final = self.root / f"step_{state.version}"
        partial = self.root / f".step_{state.version}.partial"
        budget = WriteBudget.from_env()
        # each phase's error (a bug included) reaches every rank in _agree, which removes the partial directory
        error: BaseException | None = None
        if world.is_main:
            try:
                if partial.exists():
                    shutil.rmtree(partial)
                (partial / "resume").mkdir(parents=True)
            except Exception as err:
                error = err
        self._agree(error, partial, state.version)
        # 1. HF weights, streamed parameter by parameter (collective), and the model's files
        dtype = DTYPES[self.save_dtype]
        error = save_weights(model, partial, world, self.lora, self.model_dir, dtype, budget, export)
        if world.is_main and error is None and (self.lora is None or export):
            try:
                copy_hf_files(self.model_dir, partial, self.save_dtype, self.tokenizer_dir, budget)
            except Exception as err:
                error = err
        self._agree(error, partial, state.version)
        # 2. sharded fp32 parameters + optimizer state, each rank its own shards; RNG and schedules per rank
        model_sd, optim_sd = get_state_dict(model, optimizer, options=state_dict_options(self.lora))
        sharded = {"model": model_sd, "optim": optim_sd}
        local = {"torch": torch.get_rng_state(), "scheduler": scheduler.state_dict()}
        if critic is not None:
            sharded["critic_model"], sharded["critic_optim"] = get_state_dict(critic.model, critic.optimizer)
            local["critic_scheduler"] = critic.scheduler.state_dict()
        own: dict = {}
        try:
            dcp_save(sharded, checkpoint_id=str(partial / "resume" / "dcp"))
            buffer = io.BytesIO()
            torch.save(local, buffer)
            write_durably(partial / "resume" / f"rng_rank{world.rank}.pt", buffer.getvalue(), budget)
            own = checksum_files(partial, self._own_files(partial))
        except (Exception, CheckpointException) as err:
            error = err
        self._agree(error, partial, state.version)
        # 3. rank 0: resume state, manifest, fsync, rename into place, `latest`; then prune
        entries = {path: entry for part in all_gather_objects(own, world) for path, entry in part.items()}
        if world.is_main:
            try:
                self._complete(partial, final, entries, state, budget)
            except Exception as err:
                error = err
        self._agree(error, partial, state.version)
        if world.is_main:
            self._prune(final)
        if world.world_size > 1:
            dist.barrier()
        return final

    def _own_files(self, partial: Path) -> list[str]:
        """The files this rank checksums: its DCP shards and RNG state; rank 0 also every file no rank owns."""
        own = []
        for rel in files_under(partial):
            match = _RANK_FILE.search(rel)
            owner = int(next(g for g in match.groups() if g is not None)) if match else 0
            if owner == self.world.rank:
                own.append(rel)
        return own

    def _complete(self, partial: Path, final: Path, entries: dict, state: ResumeState, budget) -> None:
        body = json.dumps(state.__dict__, indent=2).encode()
        write_durably(partial / "resume" / "state.json", body, budget)
        entries |= checksum_files(partial, ["resume/state.json"])
        write_manifest(partial, entries, version=state.version, world_size=self.world.world_size)
        fsync_tree(partial)
        stale = None
        # a checkpoint of the same version already there did not verify at resume (the run went on past it)
        if final.exists():
            stale = final.with_name(f".{final.name}.stale")
            shutil.rmtree(stale, ignore_errors=True)
            final.rename(stale)
        partial.rename(final)
        fsync_dir(self.root)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
        atomic_write_text(self.root / LATEST, final.name)

    def _agree(self, error: BaseException | None, partial: Path, version: int) -> None:
        """Every rank learns whether any rank failed the phase just done. On a failure the partial directory goes
        and every rank raises: CheckpointWriteError for a storage error, the error itself (a bug) otherwise."""
        mine = None if error is None else self._classify(error)
        failures = [(r, f) for r, f in enumerate(all_gather_objects(mine, self.world)) if f is not None]
        if not failures:
            return
        if self.world.is_main:
            shutil.rmtree(partial, ignore_errors=True)
        if mine is not None and not mine[1]:
            raise error
        where = "; ".join(f"rank {r}: {text}" for r, (text, _, _) in failures)
        if not all(storage for _, (_, storage, _) in failures):
            raise RuntimeError(f"the checkpoint of step {version} failed on another rank: {where}")
        raise CheckpointWriteError(
            f"the checkpoint of step {version} could not be written ({where}); its partial files were removed",
            no_space=any(full for _, (_, _, full) in failures),
        )

    def _classify(self, error: BaseException) -> tuple[str, bool, bool]:
        """(what failed, whether it is a storage failure, whether the disk is full). A full disk does not always
        say so: torch's zip writer (torch.save, and DCP's shards through it) reports ENOSPC as a RuntimeError
        ("unexpected pos ..."); so a failure with less than `LOW_SPACE_BYTES` left on the filesystem counts as
        one too."""
        cause = storage_error(error)
        try:
            free = shutil.disk_usage(self.root).free
        except OSError:
            free = None
        full = is_no_space(cause) or (free is not None and free < LOW_SPACE_BYTES)
        text = _describe(cause or error)
        if full and not is_no_space(cause):
            text += f" (no space left on device: {free} bytes free)"
        return text, cause is not None or full, full

    def _prune(self, newest: Path) -> None:
        """Keep the newest `keep` good checkpoints (the one just written among them); remove older ones, each renamed
        aside before it is deleted. Good: complete and not skipped by `resume`, which read every byte of them."""
        self.failed.discard(newest.name)  # replaced by a good one
        kept = [newest]
        for path in checkpoint_dirs(self.root):
            good = path.name not in self.failed and looks_complete(path)
            if len(kept) < self.keep and path != newest and good:
                kept.append(path)
        oldest = min(step_of(p) for p in kept)
        for path in checkpoint_dirs(self.root):
            if path not in kept and step_of(path) < oldest:
                log.info("removing checkpoint %s (learner.keep_checkpoints=%d)", path.name, self.keep)
                remove_tree(path)
        clear_stale(self.root)

    def oldest_kept(self) -> int | None:
        """The version of the oldest checkpoint kept: groups made durable at or before it are needed no more."""
        versions = [step_of(p) for p in checkpoint_dirs(self.root)]
        return min(versions) if versions else None

    def space_needed(self, model) -> tuple[int, str]:
        """Bytes the next checkpoint needs, and where the figure comes from: the newest complete checkpoint's size,
        or without one an estimate from the model's parameters."""
        for path in checkpoint_dirs(self.root):
            size = checkpoint_bytes(path)
            if size and looks_complete(path):
                return size, f"the size of {path.name}"
        params = sum(t.numel() for t in model.parameters() if t.requires_grad)  # global numel; no frozen base
        estimate = hf_weight_bytes(model, DTYPES[self.save_dtype]) + _RESUME_BYTES_PER_PARAM * params
        return estimate, "estimated from the model's parameters"

    # -- loading --------------------------------------------------------------------------------------------------

    def verify(self, path: Path) -> list[str]:
        """What is wrong with a checkpoint's files against its manifest ([] when nothing): every rank checksums a
        share of the files (collective). A checkpoint written before manifests existed is accepted unchecked."""
        try:
            entries, _ = read_manifest(path)
        except ManifestError as err:
            if not (path / MANIFEST).exists() and (path / "resume" / "state.json").is_file():
                if self.world.is_main:
                    log.warning(
                        "%s has no %s (written by an older sr1): loading it unverified", path, MANIFEST
                    )
                return []
            return [str(err)]
        # the largest files first, each to the rank with the fewest bytes so far: the same plan on every rank
        load = [0] * self.world.world_size
        share = []
        for entry in sorted(entries.values(), key=lambda e: (-e.size, e.path)):
            rank = load.index(min(load))
            load[rank] += entry.size
            if rank == self.world.rank:
                share.append(entry)
        problems = verify_files(path, share)
        return sorted(p for part in all_gather_objects(problems, self.world) for p in part)

    def resume(self, model, optimizer, scheduler, critic=None) -> Resumed:
        """Load the newest checkpoint that verifies and loads (every rank); the ones skipped are logged and
        returned with why. CheckpointLoadError when there are checkpoints but none can be used."""
        from torch.distributed.checkpoint.api import CheckpointException

        skipped: list[tuple[str, str]] = []
        for path in checkpoint_dirs(self.root):
            problems = self.verify(path)
            why = None
            if problems:
                more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
                why = "; ".join(problems[:3]) + more
            else:
                error = None
                try:
                    state = self.load(path, model, optimizer, scheduler, critic=critic)
                except (Exception, CheckpointException) as err:
                    error = _describe(err)
                errors = [e for e in all_gather_objects(error, self.world) if e is not None]
                if errors:
                    why = f"its files verify but it does not load: {errors[0]}"
            if why is None:
                if skipped and self.world.is_main:
                    log.warning(
                        "resuming from %s, the newest checkpoint that verifies (skipped: %s)",
                        path.name,
                        ", ".join(name for name, _ in skipped),
                    )
                return Resumed(path, state, skipped)
            skipped.append((path.name, why))
            self.failed.add(path.name)
            if self.world.is_main:
                log.warning("resume: skipping checkpoint %s: %s", path, why)
        if skipped:
            raise CheckpointLoadError(
                f"no checkpoint under {self.root} can be resumed from: "
                + "; ".join(f"{name}: {why}" for name, why in skipped)
                + ". Restore a checkpoint from a copy, or start a new run"
            )
        return Resumed(None, None, [])

    def load(self, path: Path, model, optimizer, scheduler, critic=None) -> ResumeState:
        """Restore model shards, optimizer, scheduler and RNG from `path` (every rank), and the critic's."""
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint import load as dcp_load
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        check_resumable(path, self.lora)
        model_sd, optim_sd = get_state_dict(model, optimizer, options=state_dict_options(self.lora))
        target = {"model": model_sd, "optim": optim_sd}
        if critic is not None:
            saved = FileSystemReader(str(path / "resume" / "dcp")).read_metadata().state_dict_metadata
            if not any(key.startswith("critic_model.") for key in saved):
                raise ValueError(
                    f"{path} holds no critic (saved by a run without PPO's value model); resume it with the algorithm "
                    "it was trained with, or start a new run"
                )
            target["critic_model"], target["critic_optim"] = get_state_dict(critic.model, critic.optimizer)
        dcp_load(target, checkpoint_id=str(path / "resume" / "dcp"))
        states = {"model_state_dict": target["model"], "optim_state_dict": target["optim"]}
        set_state_dict(model, optimizer, **states, options=state_dict_options(self.lora))
        if critic is not None:
            set_state_dict(
                critic.model,
                critic.optimizer,
                model_state_dict=target["critic_model"],
                optim_state_dict=target["critic_optim"],
            )
        rng_path = path / "resume" / f"rng_rank{self.world.rank}.pt"
        if not rng_path.is_file():
            rng_path = path / "resume" / "rng_rank0.pt"  # resumed under a larger world
        extra = torch.load(rng_path, weights_only=True)  # tensors and plain values: nothing in it can run
        torch.set_rng_state(extra["torch"])
        scheduler.load_state_dict(extra["scheduler"])
        if critic is not None:
            critic.scheduler.load_state_dict(extra["critic_scheduler"])
        return ResumeState(**json.loads((path / "resume" / "state.json").read_text()))
