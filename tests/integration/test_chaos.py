"""Crash anything, lose nothing: a short `sr1 run` in which the generator, the learner, Redis, the retrieval server
and the `sr1 run` parent itself are SIGKILLed in turn at random steps (resumed with `sr1 run --resume` when the
parent died). The machinery is `scripts/chaos/chaos.py`, which also prints the table of one run per part.

Asserted at the end: the run reaches its last step; in the history that survives, every released prompt is trained
exactly once or is still pending, and versions strictly increase; the staleness bound held on every loss token; no
process of the run outlives it. A table of the time to recover from each fault is printed (`-s` shows it).
`CHAOS_SEED` picks other kill steps (the default is fixed, so CI is repeatable).

Faults that kill nothing are `test_chaos_faults.py`; a full disk and a torn checkpoint `test_chaos_checkpoints.py`;
the network and a full Redis `test_chaos_network.py` (each its own file, so test workers can run them side by side).
"""

from __future__ import annotations

import json
import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]

# a kill every 2 steps or so (the last one lands at step 11 at the latest, whatever CHAOS_SEED), a checkpoint every
# 3: the learner's and the parent's kills each lose a step or two since a checkpoint, as with longer runs
STEPS = 12
SPACING = 2
CHECKPOINT_EVERY = 3
MAX_STALENESS = 2


def test_kill_every_part_in_turn_and_finish(tmp_path):
    from scripts.chaos import chaos
    from scripts.chaos.base import surviving_steps
    from sr1.summary import surviving_history

    run_dir = tmp_path / "chaos"
    recoveries, verdict = chaos.run_chaos(
        run_dir,
        ["generator", "learner", "redis", "retrieval", "parent"],
        steps=STEPS,
        checkpoint_every=CHECKPOINT_EVERY,
        max_staleness=MAX_STALENESS,
        spacing=SPACING,
        seed=int(os.environ.get("CHAOS_SEED", "7")),
    )
    print("\n" + chaos.table([(r, verdict) for r in recoveries]))

    last_log = sorted(tmp_path.glob("chaos-sr1-run-*.log"))[-1]
    assert verdict.completed, last_log.read_text()[-4000:]
    assert not verdict.orphans, verdict.orphans
    assert verdict.versions_increase
    assert verdict.lost == 0 and verdict.trained_twice == 0
    assert verdict.max_staleness_seen <= MAX_STALENESS
    # the per-step metrics of the surviving history agree with the buffer's histogram
    rows, segments = surviving_history(
        [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    )
    assert max(r["staleness/max"] for r in rows) <= MAX_STALENESS
    # the learner restarted after its own kill, and with the new stack after the parent's
    assert len(segments) >= 3
    # the metrics' surviving history is the one the groups file describes (a step lost to a crash is in neither)
    assert [r["step"] for r in rows] == [s["version"] for s in surviving_steps(run_dir)]
