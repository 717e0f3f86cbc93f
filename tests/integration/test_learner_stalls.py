"""A learner of two ranks waits out a stall of generation longer than its collective timeout (issue #49): the
retrieval server frozen (SIGSTOP, then SIGCONT: the tool pause stops all sampling), then the generator worker frozen,
each past `learner.collective_timeout_s` (made short by `scripts/chaos/chaos_freeze.py`), under synchronous training. Rank 0 waits for the batch as long
as it must and holds the other rank every 2 s (learner/distributed.py's `Hold`), so the run finishes with no learner
restart, nothing lost or trained twice (audited as the kills: `scripts/chaos/chaos.py`). Before the holds, rank 1's
collective timed out and the supervisor restarted the whole learner at the first stall.

`test_chaos_freeze.py` freezes every part in one longer run; this is the short run of the two stalls the issue met.
"""

from __future__ import annotations

import json
import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1200)]

STEPS = 8  # a stall at version 2 or 3, the next at 5 or 6 (`injection_steps`), and steps after each


def test_generation_stalled_past_the_collective_timeout_restarts_no_learner(tmp_path):
    from scripts.chaos import chaos_freeze

    past_timeout = chaos_freeze.freeze_seconds("timeout")
    assert past_timeout > chaos_freeze.COLLECTIVE_TIMEOUT_S
    run_dir = tmp_path / "stalls"
    row = chaos_freeze.run_freezes(
        run_dir,
        [("retrieval", past_timeout), ("generator", past_timeout)],
        steps=STEPS,
        seed=int(os.environ.get("CHAOS_SEED", "7")),
        max_staleness=0,  # synchronous: every step waits for fresh groups, so a stall of generation stalls training
    )
    print("\n" + chaos_freeze.table([row]))

    log = sorted(tmp_path.glob("stalls-sr1-run-*.log"))[-1].read_text()[-4000:]
    verdict = row.verdict
    assert verdict.completed, log
    assert row.learner_restarts == 0, log
    assert verdict.lost == 0 and verdict.trained_twice == 0 and not verdict.orphans
    assert verdict.versions_increase and verdict.max_staleness_seen <= verdict.max_staleness
    # the learner did wait past its collective timeout between two steps, with both ranks alive all along
    assert max(step_gaps(run_dir)) > chaos_freeze.COLLECTIVE_TIMEOUT_S, step_gaps(run_dir)


def step_gaps(run_dir) -> list[float]:
    """Seconds between consecutive steps' metrics rows (a wait for a batch includes any re-publish meanwhile)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    times = [row["time"] for row in rows if "step" in row and "time" in row]
    return [b - a for a, b in zip(times, times[1:], strict=False)]
