"""A full disk, then a torn checkpoint, in a real run (`scripts/chaos/chaos.py --checkpoint-faults`): two saves in a row fail
and the run stops with exit status 74, leaving no partial files; its last good checkpoint is cut to half, and the
resume skips it, loads the one before and finishes the run. Asserted as for the kills (`test_chaos.py`): complete,
nothing lost or trained twice, the staleness bound held, no orphans.

Two whole-stack starts cost minutes, so this runs in the long tier (`make test-long`); CI covers the same faults on the real learner
and Redis in `test_learner_resume.py` (two failed checkpoints stop the learner with 74 and it resumes from the last
good one; a torn checkpoint is skipped for the one before).
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]

MAX_STALENESS = 2


def test_a_full_disk_and_a_torn_checkpoint_are_survived(tmp_path):
    """10 steps, a checkpoint every 2: the disk fills up once step_4 is written (step_6 fails, training goes on,
    step_8 fails and the run stops with 74 saying the space it needs), step_4 is then cut to half and the resume
    loads step_2 and finishes. The disk fills up through the checkpoint writer's ENOSPC hook, which needs no
    privileges; `scripts/chaos/chaos.py --checkpoint-faults --disk-full tmpfs` does it with a real tmpfs."""
    from scripts.chaos import chaos_checkpoints as checkpoints

    verdict, faults = checkpoints.run_checkpoint_faults(
        tmp_path / "ckpt", every=2, max_staleness=MAX_STALENESS
    )
    print("\n", verdict, "\n", faults.skipped, faults.stop_code)

    last_log = sorted(tmp_path.glob("ckpt-sr1-run-*.log"))[-1]
    assert verdict.completed, last_log.read_text()[-4000:]
    assert verdict.lost == 0 and verdict.trained_twice == 0 and not verdict.orphans
    assert verdict.versions_increase and verdict.max_staleness_seen <= MAX_STALENESS
    assert faults.missing(2) == [], faults
