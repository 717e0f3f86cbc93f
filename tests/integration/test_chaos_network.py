"""A network that drops and a Redis that fills up, in a real `sr1 run` (scripts/chaos_network.py): the generator cut
from Redis, the learner cut from Redis and the generator cut from the retrieval server, each for 20 s through fault
proxies that black-hole the connections (open, unanswered, delivered late), past every lease and heartbeat of the run
(10 s and 5 s); then Redis's maxmemory lowered under the run (high water, then full). Nothing is killed.

Asserted at the end, as for the kills: the run finished by itself, every released prompt trained exactly once or still
pending, versions only went up, the staleness bound held, no orphans; and each fault was seen where the run reports
it. `python scripts/chaos.py --network --cut-s 60` is the long version.
"""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

STEPS = 16  # the last fault lands by version 9: the run goes on well after it
CUT_S = 20  # past buffer.lease_s (10), buffer.learner_lease_s (10) and buffer.heartbeat_ttl_s (5) of the run
MEMORY_S = 8


def test_network_cuts_and_a_full_redis_are_ridden_out(tmp_path):
    from scripts.chaos_network import NETWORK_FAULTS, run_network_faults

    verdict, counts = run_network_faults(
        tmp_path / "network",
        list(NETWORK_FAULTS),
        steps=STEPS,
        seed=int(os.environ.get("CHAOS_SEED", "7")),
        cut_s=CUT_S,
        memory_s=MEMORY_S,
    )
    print("\n", verdict, "\n", counts)

    last_log = sorted(tmp_path.glob("network-sr1-run-*.log"))[-1]
    assert verdict.completed, last_log.read_text()[-4000:]
    assert verdict.lost == 0 and verdict.trained_twice == 0 and not verdict.orphans
    assert verdict.versions_increase and verdict.max_staleness_seen <= verdict.max_staleness
    assert counts.missing(list(NETWORK_FAULTS)) == [], counts
