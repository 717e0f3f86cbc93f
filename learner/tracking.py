"""Metrics: JSONL in `<run_dir>/metrics.jsonl` always, wandb when enabled, nothing on ranks other than 0.

    tracker = Tracker(run_dir, logging_cfg, world.rank, config=resolved_config_dict)
    tracker.log({"loss/total": 0.12, "staleness/max": 2}, step=7)
    tracker.log_eval({"eval/em": 0.41, "eval/em/nq": 0.38, ...}, step=50)
    tracker.close()

`sr1 run` reads metrics.jsonl for its live view and final report: one JSON object per line with `step`, `time`
and the namespaced keys (`loss/...`, `staleness/...`, `perf/...`, `learner/version`); a `{"segment": ...}` line where
a learner process starts; an `{"eval_step": ...}` line per evaluation (`eval/...` keys: no `step`, so readers of step
rows skip it).

Every metric that verl / Search-R1 logs under another name is logged under that name too (`METRIC_ALIASES`), so a
dashboard built on Search-R1's runs shows an sr1 run beside them; docs/search-r1.md ("Metrics") lists the pairs.

wandb: one wandb run per sr1 run. Its id is kept in `<run_dir>/wandb_run_id` and reused by every later process of
the run (a resumed learner, `sr1 run`'s final evaluation), so a resumed run goes on as the same wandb run.
Evaluations are charted against `eval/step`, the version they evaluated. The run's config goes to wandb with its
secrets masked (common/secrets.py), and so does the command line wandb records: the Redis URL's password and the
retrieval token never reach wandb's servers nor its `wandb/` folder.

A full disk (ENOSPC, EDQUOT) under a record of the run (`metrics.jsonl`, the coordinator's `learner_groups.jsonl`,
through `append_line`) stops the learner as a full disk under its checkpoints does (`RecordsFailing`: exit 74,
which supervisors do not restart), instead of a crash that a restart repeats.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import string
import sys
import time
from pathlib import Path
from typing import IO, Any

from common.secrets import mask_argv, mask_config
from learner.checkpoints.files import NO_SPACE_ERRNOS
from learner.checkpoints.safety_net import CheckpointsFailing

log = logging.getLogger(__name__)


class RecordsFailing(CheckpointsFailing):
    """A record of the run (`metrics.jsonl`, `learner_groups.jsonl`) cannot be written: its disk is full. The learner
    stops as it does when its checkpoints cannot be written (`config.EXIT_CHECKPOINT_FAILED`, not restarted: a
    restart would fail on the same disk)."""


def append_line(file: IO[str], line: str, path: Path) -> None:
    """Write one line to a run's record; a full disk raises RecordsFailing, saying what to do."""
    try:
        file.write(line + "\n")
    except OSError as err:
        if err.errno not in NO_SPACE_ERRNOS:
            raise
        raise RecordsFailing(
            f"cannot write {path}: {err.strerror or err}. The learner stops (a restart would fail the same way): "
            "free space there, then resume the run with --resume; it goes on from the last good checkpoint"
        ) from err


def close_record(file: IO[str], path: Path) -> None:
    """Close a run's record. It is line-buffered, so every whole line is written already; a line a full disk refused
    is still in the buffer and fails again here: logged, so that the error that stops the learner stays the one
    raised (RecordsFailing)."""
    try:
        file.close()
    except OSError as err:
        log.warning("closing %s: %s", path, err)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# sr1 key -> the name verl / Search-R1 logs the same quantity under (docs/search-r1.md, "Metrics")
METRIC_ALIASES: dict[str, str] = {
    "batch/reward_mean": "critic/score/mean",
    "batch/response_len_mean": "response_length/mean",
    "batch/truncated_frac": "response_length/clip_ratio",
    "batch/tool_calls_per_traj": "env/number_of_valid_search",
    "loss/pg": "actor/pg_loss",
    "loss/entropy": "actor/entropy_loss",
    "loss/clipped_frac": "actor/pg_clipfrac",
    "loss/mismatch_kl": "actor/ppo_kl",
    "loss/kl_ref": "actor/kl_loss",
    "kl/coef": "actor/kl_coef",
    "loss/grad_norm": "actor/grad_norm",
    "loss/lr": "actor/lr",
    "critic/value_loss": "critic/vf_loss",
    "critic/clipped_frac": "critic/vf_clipfrac",
    "critic/value_mean": "critic/vpred_mean",
    "critic/return_mean": "critic/returns/mean",
    "critic/explained_var": "critic/vf_explained_var",
    "perf/step_s": "timing_s/step",
    "perf/wait_s": "timing_s/gen",
}
# the same for a family of keys: sr1 prefix -> Search-R1 prefix (the rest of the key, a data source, is kept)
METRIC_ALIAS_PREFIXES: dict[str, str] = {"eval/reward/": "val/test_score/"}


def metric_aliases(metrics: dict[str, Any]) -> dict[str, Any]:
    """The Search-R1 names of the metrics in `metrics` that have one, with their values."""
    out = {METRIC_ALIASES[k]: v for k, v in metrics.items() if k in METRIC_ALIASES}
    for key, value in metrics.items():
        for prefix, theirs in METRIC_ALIAS_PREFIXES.items():
            if key.startswith(prefix) and "/" not in key[len(prefix) :]:
                out[theirs + key[len(prefix) :]] = value
    return out


def merge_metrics(*parts: dict[str, Any]) -> dict[str, Any]:
    """One row from the metrics of several emitters; a key two emitters both report is a bug, not an overwrite."""
    merged: dict[str, Any] = {}
    for part in parts:
        clash = merged.keys() & part.keys()
        if clash:
            raise ValueError(f"metric keys reported twice in one row: {sorted(clash)}")
        merged.update(part)
    return merged


class Tracker:
    def __init__(
        self,
        run_dir: Path | None,
        logging_cfg=None,
        rank: int = 0,
        config: dict | None = None,
        metrics_file: bool = True,
    ):
        self.active = rank == 0 and run_dir is not None
        self._file = None
        self._wandb = None
        self._last_step = 0
        self._path = Path(run_dir or ".") / "metrics.jsonl"
        if not self.active:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if metrics_file:
            # line-buffered (readers see whole lines); open for the tracker's life, closed in close()
            self._file = open(self._path, "a", buffering=1)  # noqa: SIM115
        if logging_cfg is not None and logging_cfg.wandb:
            self._wandb = _wandb_run(run_dir, logging_cfg, config or {})

    def mark_segment(self, info: dict[str, Any]) -> None:
        """A line `{"segment": info}` where a learner process starts (info: its start version, the checkpoint it
        resumed from, ...): readers of the file drop the rows of steps that a later segment trained again."""
        if self._file is not None:
            append_line(self._file, json.dumps({"segment": info}), self._path)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.active:
            return
        values = {k: _plain(v) for k, v in metrics.items()}
        record = {"step": int(step), "time": time.time()} | merge_metrics(values, metric_aliases(values))
        if self._file is not None:
            append_line(self._file, json.dumps(record), self._path)
        if self._wandb is not None:
            self._last_step = max(self._last_step, int(step))
            self._wandb.log(
                {k: v for k, v in record.items() if k not in ("step", "time")}, step=self._last_step
            )

    def log_eval(self, result: dict[str, Any], step: int) -> None:
        """One evaluation of the policy at version `step` (the `eval/...` keys of `evaluation/report.py`)."""
        if not self.active:
            return
        values = {k: _plain(v) for k, v in result.items() if k.startswith("eval/")}
        values = merge_metrics(values, metric_aliases(values))
        if self._file is not None:
            append_line(
                self._file, json.dumps({"eval_step": int(step), "time": time.time()} | values), self._path
            )
        if self._wandb is not None:
            # charted against eval/step; logged at the latest training step (wandb's own steps only go up)
            self._wandb.log(values | {"eval/step": int(step)}, step=self._last_step)

    def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            close_record(file, self._path)
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _wandb_run(run_dir: Path, logging_cfg, config: dict) -> Any:
    """Start (or resume) the run's one wandb run; its id lives in `<run_dir>/wandb_run_id`."""
    import wandb

    id_file = run_dir / "wandb_run_id"
    if id_file.exists():
        run_id = id_file.read_text().strip()
    else:
        run_id = new_run_id()
        tmp = id_file.with_suffix(".tmp")
        tmp.write_text(run_id + "\n")
        tmp.replace(id_file)
    # wandb records the process's command line too (its run metadata, from sys.argv): it sees it masked while it
    # starts, as it sees the config
    argv = sys.argv
    sys.argv = mask_argv(argv)
    try:
        run = wandb.init(
            project=logging_cfg.wandb_project,
            entity=logging_cfg.wandb_entity,
            mode=logging_cfg.wandb_mode,
            dir=str(run_dir),
            config=mask_config(config),  # no password or token leaves the process (common/secrets.py)
            name=run_dir.name,
            id=run_id,
            resume="allow",
        )
    finally:
        sys.argv = argv
    run.define_metric("eval/step")
    run.define_metric("eval/*", step_metric="eval/step")
    run.define_metric("val/*", step_metric="eval/step")  # Search-R1's names of evaluation metrics
    log.info("wandb run %s (%s, %s)", run_id, logging_cfg.wandb_project, logging_cfg.wandb_mode)
    return run


def new_run_id() -> str:
    """A new wandb run id: 8 lowercase letters and digits, as wandb makes them (made here: wandb 0.31 no longer has
    the `wandb.util.generate_id` older versions offered, and its own generator is not public API)."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))
