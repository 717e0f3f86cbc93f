"""Hang anything, restart nothing (`scripts/chaos/chaos.py --freeze`, scripts/chaos/chaos_freeze.py): a run of two learner ranks
in which every part is frozen in turn (SIGSTOP, then SIGCONT), the retrieval server, Redis and the generator past the
learner's collective timeout (made short by `learner.collective_timeout_s`) and past `buffer.reconnect_s`, the engine
core and a learner rank for a few seconds. Asserted as for the kills (`test_chaos.py`): the run finishes, nothing lost or trained twice,
the bound held, no orphans; and the learner never restarted (only a learner rank frozen past the timeout may cost a
restart, and that one is frozen for less).
"""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SHORT_S = 5


def test_freezes_past_the_collective_timeout_restart_nothing(tmp_path):
    from scripts.chaos import chaos_freeze

    past_timeout = chaos_freeze.freeze_seconds("timeout")
    freezes = [
        ("retrieval", past_timeout),
        ("redis", past_timeout),  # rank 0 waits out the outage, its other rank held
        ("generator", past_timeout),
        ("engine", SHORT_S),
        ("learner", SHORT_S),
    ]
    run_dir = tmp_path / "freeze"
    row = chaos_freeze.run_freezes(
        run_dir, freezes, steps=3 * len(freezes) + 3, seed=int(os.environ.get("CHAOS_SEED", "7"))
    )
    print("\n" + chaos_freeze.table([row]))

    last_log = sorted(tmp_path.glob("freeze-sr1-run-*.log"))[-1]
    verdict = row.verdict
    assert verdict.completed, last_log.read_text()[-4000:]
    assert verdict.lost == 0 and verdict.trained_twice == 0 and not verdict.orphans
    assert verdict.versions_increase and verdict.max_staleness_seen <= verdict.max_staleness
    assert row.learner_restarts == 0, last_log.read_text()[-4000:]
