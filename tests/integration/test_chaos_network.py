"""A Redis that fills up and a network that drops, in a real `sr1 run` (scripts/chaos/chaos_network.py): first Redis's
maxmemory lowered under the run (high water, then full); then the generator cut from Redis, the learner cut from
Redis and the generator cut from the retrieval server, through fault proxies that black-hole the connections (open,
unanswered, delivered late), each for 5 s (under every lease and the socket timeout: replies only come late) and then
for 20 s (past every lease and heartbeat of the run: 10 s and 5 s). Nothing is killed.

Asserted at the end, as for the kills: the run finished by itself, every released prompt trained exactly once or still
pending, versions only went up, the staleness bound held, no orphans; and each cut met live connections and was seen
where the run reports it.

The 60 s cuts (past `buffer.reconnect_s` as well: the calls give up) cost minutes, so they run in
the long tier, `make test-long` (or `python scripts/chaos/chaos.py --network --cut-s 60`).
"""

from __future__ import annotations

import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]

MEMORY_S = 8


def _run(tmp_path, cuts_s: list[float], steps: int, cut_mode: str = "blackhole"):
    from scripts.chaos.chaos_network import NETWORK_FAULTS, injections, run_network_faults

    faults = list(NETWORK_FAULTS)
    verdict, counts = run_network_faults(
        tmp_path / "network",
        faults,
        steps=steps,
        seed=int(os.environ.get("CHAOS_SEED", "7")),
        cuts_s=cuts_s,
        memory_s=MEMORY_S,
        cut_mode=cut_mode,
    )
    print("\n", verdict, "\n", counts)

    last_log = sorted(tmp_path.glob("network-sr1-run-*.log"))[-1]
    assert verdict.completed, last_log.read_text()[-4000:]
    assert verdict.lost == 0 and verdict.trained_twice == 0 and not verdict.orphans
    assert verdict.versions_increase and verdict.max_staleness_seen <= verdict.max_staleness
    assert counts.missing(injections(faults, cuts_s)) == [], counts


def test_network_cuts_and_a_full_redis_are_ridden_out(tmp_path):
    # a full Redis and 20 s cuts (past every lease and heartbeat): 4 injections, one every 2 versions from version 2
    # or later (a 20 s cut can take a few versions to recover from); the run goes on after the last. The 5 s cuts run in the long tier (below): a client that is
    # quiet for the whole cut (a learner training) makes a short cut meet nothing, which the check then refuses.
    _run(tmp_path, cuts_s=[20], steps=16)


def test_network_cuts_past_reconnect_s_are_ridden_out(tmp_path):
    """5 s cuts (under every lease) and 60 s cuts: past every lease and past `buffer.reconnect_s` (60 s), so the cut
    clients' calls give up (the learner process ends and is restarted; a generator keeps its groups and keeps
    trying). Dropped connections (reset), where the CI test black-holes them."""
    _run(tmp_path, cuts_s=[5, 60], steps=20, cut_mode="drop")
