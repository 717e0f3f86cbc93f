"""scripts/chaos/chaos_network.py without a run: what `--cut-s` injects, in which order, and when a cut counts as seen."""

from __future__ import annotations

import pytest

from scripts.chaos.chaos_network import NETWORK_FAULTS, Cut, NetworkCounts, injections, parse_injection


def _counts(
    cuts: list[Cut], unreachable: dict[str, int], tool_errors: int = 0, oom: int = 0
) -> NetworkCounts:
    return NetworkCounts(
        cuts=cuts,
        redis_unreachable_lines=unreachable,
        out_of_memory_lines=oom,
        releases_paused_seen=oom > 0,
        tool_errors=tool_errors,
        recoveries=[],
        duplicates=0,
        bytes_per_group=None,
        id_bytes_per_group=None,
    )


def test_the_memory_fault_comes_first_then_every_cut_once_per_duration_the_shorter_first():
    injected = injections(list(NETWORK_FAULTS), [20, 5])
    assert injected == [
        "redis-maxmemory",
        "cut-generator-redis 5s",
        "cut-learner-redis 5s",
        "cut-generator-retrieval 5s",
        "cut-generator-redis 20s",
        "cut-learner-redis 20s",
        "cut-generator-retrieval 20s",
    ]
    assert [parse_injection(i) for i in injected[3:5]] == [
        ("cut-generator-retrieval", 5.0),
        ("cut-generator-redis", 20.0),
    ]
    assert parse_injection("redis-maxmemory") == ("redis-maxmemory", None)


def test_a_cut_is_seen_when_it_met_connections_and_a_long_one_also_where_the_client_reports_it():
    injected = [
        "cut-generator-redis 5s",
        "cut-learner-redis 5s",
        "cut-generator-redis 20s",
        "cut-learner-redis 20s",
    ]
    cuts = [
        Cut("cut-generator-redis", 5, 1),  # short: held traffic back, reported by no one: seen
        Cut("cut-learner-redis", 5, 0),  # met no connection: not seen
        Cut("cut-generator-redis", 20, 2),  # long, and the generator's log says so: seen
        Cut("cut-learner-redis", 20, 3),  # long, but the learner's log says nothing: not seen
    ]
    counts = _counts(cuts, {"generator-0.log": 2, "learner.log": 0})
    assert counts.missing(injected) == ["cut-learner-redis 5s", "cut-learner-redis 20s"]


def test_a_retrieval_cut_is_seen_by_its_tool_errors_and_the_memory_fault_by_its_lines():
    injected = ["cut-generator-retrieval 20s", "redis-maxmemory"]
    cuts = [Cut("cut-generator-retrieval", 20, 4)]
    assert _counts(cuts, {}).missing(injected) == injected
    assert _counts(cuts, {}, tool_errors=3, oom=1).missing(injected) == []


@pytest.mark.parametrize("bad", ["5,x", "0", ","])
def test_bad_cut_durations_are_refused_before_anything_starts(bad, capsys):
    from scripts.chaos.chaos import main

    with pytest.raises(SystemExit) as exit_:
        main(["--network", "--cut-s", bad])
    assert exit_.value.code == 2 and "--cut-s" in capsys.readouterr().err
