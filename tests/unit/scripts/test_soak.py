"""scripts/chaos/soak.py's growth verdict (scripts/chaos/soak_samples.py) on synthetic series: flat passes, growing fails, noisy flat passes; and what it
says about processes that come and go during the measured span."""

from __future__ import annotations

import random

import pytest

WARMUP, WINDOW, BOUND = 600.0, 300.0, 0.05


@pytest.fixture(scope="module")
def soak():
    from scripts.chaos import soak

    return soak


def _samples(
    rss,
    *,
    duration=3600.0,
    interval=30.0,
    redis_keys=lambda t: 20,
    fds=lambda t: 30,
    pid=100,
    present=lambda t: True,
):
    """One sample every `interval` s of one learner process with RSS `rss(t)` and a Redis with `redis_keys(t)`."""
    samples = []
    for i in range(int(duration / interval) + 1):
        t = i * interval
        procs = {}
        if present(t):
            procs[f"learner[{pid}]"] = {
                "kind": "learner",
                "pid": pid,
                "rss_mib": rss(t),
                "fds": fds(t),
                "threads": 12,
            }
        redis = {"used_memory_mib": 1.5, "keys": redis_keys(t), "version": i}
        samples.append({"t": t, "processes": procs, "redis": redis})
    return samples


def _judge(soak, samples):
    return soak.verdict(samples, warmup_s=WARMUP, window_s=WINDOW, bound=BOUND)


def test_a_flat_series_passes_even_after_a_steep_warm_up(soak):
    results, problems = _judge(soak, _samples(lambda t: 800.0 if t >= WARMUP else 100.0 + t))
    assert problems == []
    rss = next(r for r in results if r.metric == "rss_mib")
    assert rss.growth == 0.0 and not rss.failed


def test_a_steadily_growing_series_fails_naming_the_process_and_metric(soak):
    # 800 MiB growing by 10 % over the measured 50 minutes: a leak of ~1.6 MiB/min
    results, problems = _judge(soak, _samples(lambda t: 800.0 * (1 + 0.10 * max(0.0, t - WARMUP) / 3000)))
    assert len(problems) == 1
    assert "learner[100] rss_mib" in problems[0] and "grew" in problems[0]
    rss = next(r for r in results if r.metric == "rss_mib")
    assert rss.failed and rss.growth == pytest.approx(0.10)  # the line through the samples: the whole 10 %


def test_growth_just_inside_the_bound_passes(soak):
    _, problems = _judge(soak, _samples(lambda t: 800.0 * (1 + 0.04 * max(0.0, t - WARMUP) / 3000)))
    assert problems == []


def test_a_noisy_flat_series_with_spikes_passes(soak):
    rng = random.Random(0)
    # +-3 % noise and a 50 % spike (a checkpoint, an evaluation) in a tenth of the samples, in both windows
    noisy = {
        t: 800.0 * (1 + rng.uniform(-0.03, 0.03)) * (1.5 if rng.random() < 0.1 else 1.0)
        for t in range(0, 3601, 30)
    }
    results, problems = _judge(soak, _samples(lambda t: noisy[int(t)]))
    assert problems == []
    assert abs(next(r for r in results if r.metric == "rss_mib").growth) < BOUND


def test_small_counts_move_within_their_floor_but_a_growing_key_count_fails(soak):
    _, problems = _judge(soak, _samples(lambda t: 800.0, redis_keys=lambda t: 20 if t < 2400 else 22))
    assert problems == []  # +2 keys (10 %) is churn at this size: within the floor of 2
    _, problems = _judge(soak, _samples(lambda t: 800.0, redis_keys=lambda t: 20 + int(t // 120)))
    assert len(problems) == 1 and "redis-db keys" in problems[0]


def test_a_series_that_swings_between_two_levels_passes_but_one_that_also_keeps_some_fails(soak):
    # a server's descriptors with its connections (~40 open, ~130 at an evaluation), or a process that gives its
    # freed memory back after each step, sampled mid-step or between steps: in a quieter spell (600-900 s) the high
    # level is seen in a third of the samples, elsewhere in two thirds, so window medians would say 40 -> 130
    def swinging(t):
        high = int(t // 30) % 3 == 0
        return (130 if high else 40) if 600 <= t < 900 else (40 if high else 130)

    results, problems = _judge(soak, _samples(lambda t: 800.0, fds=swinging))
    assert problems == []
    assert abs(next(r for r in results if r.metric == "fds").growth) < BOUND
    results, problems = _judge(soak, _samples(lambda t: 4 * swinging(t) + 400))  # RSS swinging 560-920 MiB
    assert problems == []
    # one descriptor kept every 2 minutes on top of the same swing
    _, problems = _judge(soak, _samples(lambda t: 800.0, fds=lambda t: swinging(t) + int(t // 120)))
    assert len(problems) == 1 and "learner[100] fds" in problems[0] and "grew" in problems[0]


def test_a_process_that_exits_or_appears_during_the_measured_span_is_named(soak):
    exited = _samples(lambda t: 800.0, present=lambda t: t < 2000)
    _, problems = _judge(soak, exited)
    assert any("learner[100] exited" in p for p in problems)
    restarted = _samples(lambda t: 800.0, pid=200, present=lambda t: t >= 2000)
    _, problems = _judge(soak, restarted)
    assert any("learner[200] started after the warm-up" in p for p in problems)


def test_a_run_too_short_for_the_warm_up_is_refused(soak, capsys):
    _, problems = _judge(soak, _samples(lambda t: 800.0, duration=500))
    assert problems and "run longer" in problems[0]
    with pytest.raises(SystemExit):
        soak.main(["--duration", "900", "--warmup", "600", "--window", "300"])
    assert "at least two windows of 300 s" in capsys.readouterr().err


def test_a_process_that_renames_itself_is_one_series_under_its_latest_name(soak):
    samples = _samples(lambda t: 800.0)
    for sample in samples[
        : len(samples) // 2
    ]:  # in the first half hour it was `engine-core-child:python[100]`
        sample["processes"] = {"engine-core-child:python[100]": sample["processes"].pop("learner[100]")}
    results, problems = _judge(soak, samples)
    assert problems == []
    assert {r.series for r in results if r.metric == "rss_mib"} == {"learner[100] rss_mib"}
