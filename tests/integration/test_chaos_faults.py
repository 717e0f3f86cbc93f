"""A run in which nothing is killed but everything goes wrong (`scripts/chaos/chaos.py --faults`, scripts/chaos/chaos_faults.py):
a poison prompt, a malformed group payload, malformed evaluation requests and a frozen retriever under synchronous
training. Asserted as for the kills (`test_chaos.py`): the run finishes with nothing lost or trained twice and no orphans; and each event
is counted where the run reports it.
"""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]

FAULT_STEPS = 10
RETRIEVER_DOWN_S = 20  # `scripts/chaos/chaos.py --faults` takes 60 by default


def test_faults_that_kill_nothing_are_survived_and_counted(tmp_path):
    """A synchronous run (max_staleness 0, where one lost group would stop training for good) with a poison prompt, a
    malformed group payload, malformed evaluation requests and the retriever frozen for a while: the run finishes
    with nothing lost or trained twice, and every event is counted where the run reports it."""
    from scripts.chaos import chaos_faults

    run_dir = tmp_path / "faults"
    verdict, counts = chaos_faults.run_faults(
        run_dir,
        list(chaos_faults.FAULTS),
        steps=FAULT_STEPS,
        seed=int(os.environ.get("CHAOS_SEED", "7")),
        retriever_down_s=RETRIEVER_DOWN_S,
    )
    print("\n", verdict, "\n", counts)

    last_log = sorted(tmp_path.glob("faults-sr1-run-*.log"))[-1]
    assert verdict.completed, last_log.read_text()[-4000:]
    assert verdict.lost == 0 and verdict.trained_twice == 0 and not verdict.orphans
    assert verdict.max_staleness_seen == 0 and verdict.dead_lettered >= 2
    assert counts.missing(list(chaos_faults.FAULTS)) == [], counts
