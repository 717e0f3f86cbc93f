"""A full disk under the run's records (`metrics.jsonl`, `learner_groups.jsonl`) stops the learner as a full disk
under its checkpoints does: exit status 74 (`config.EXIT_CHECKPOINT_FAILED`, which supervisors do not restart) and a
message saying what to do, not a crash that a restart repeats. `/dev/full` gives the kernel's own ENOSPC."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import EXIT_CHECKPOINT_FAILED, load_config, save_config

pytestmark = [
    pytest.mark.slow,  # a learner process per case
    pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (every write: ENOSPC)"),
]


def _learner_config(tmp_path: Path, model_dir: Path, redis_url: str) -> tuple[Path, Path]:
    run_dir = tmp_path / "run"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": [{"role": "user", "content": f"q{i}"}], "golden_answers": ["a"]}) + "\n"
            for i in range(8)
        )
    )
    overrides = [
        f"model.path={model_dir}",
        f"run_dir={run_dir}",
        f"data.train_files=[{prompts}]",
        f"buffer.redis_url={redis_url}",
        "buffer.namespace=diskfull",
        "learner.num_engines=0",
    ]
    return save_config(load_config("tiny", overrides), tmp_path), run_dir


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "record",
    ["metrics.jsonl", pytest.param("learner_groups.jsonl", marks=pytest.mark.long)],  # one path, two files
)
def test_a_full_disk_under_a_record_stops_the_learner_with_74(record, tiny_model_dir, redis_url, tmp_path):
    config_path, run_dir = _learner_config(tmp_path, tiny_model_dir, redis_url)
    run_dir.mkdir(parents=True)
    (run_dir / record).symlink_to("/dev/full")  # its first line (where the learner starts) meets ENOSPC
    proc = subprocess.run(
        [sys.executable, "-m", "sr1.entrypoints.learner", "--config", str(config_path)],
        env=os.environ | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == EXIT_CHECKPOINT_FAILED, proc.stderr[-3000:]
    assert f"cannot write {run_dir / record}: No space left on device" in proc.stderr
    assert "free space there, then resume the run with --resume" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
