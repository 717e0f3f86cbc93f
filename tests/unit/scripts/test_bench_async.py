"""scripts/bench/bench_async.py: which runs it starts for a preset, an adaptive bound and a correction, and what it refuses."""

from __future__ import annotations

import pytest


@pytest.fixture
def bench_async():
    from scripts.bench import bench_async

    return bench_async


def test_an_adaptive_bound_on_a_preset_is_run_against_the_synchronous_run(
    bench_async, tmp_path, monkeypatch, capsys
):
    started = []

    def fake_run_case(case, seed, out, extra, preset="tiny"):
        started.append((case.name, case.overrides, preset, list(extra), out))
        out.mkdir(parents=True, exist_ok=True)
        return out / case.name

    sync_then_auto = iter([(10.0, 4.0, 0.5), (6.0, 0.5, 0.6)])

    def fake_phases(run_dir, warmup):
        step_s, wait_s, em = next(sync_then_auto)
        return {
            "step_s": step_s,
            "wait_s": wait_s,
            "train_s": step_s - wait_s,
            "steps_per_min": 60.0 / step_s,
            "learner_busy": 1 - wait_s / step_s,
            "generator_busy": 0.5,
            "em_before": 0.36,
            "em_after": em,
        }

    monkeypatch.setattr(bench_async, "run_case", fake_run_case)
    monkeypatch.setattr(bench_async, "phases", fake_phases)
    monkeypatch.setattr(bench_async, "plot", lambda *a: None)
    monkeypatch.setattr(bench_async, "ROOT", tmp_path)
    argv = [
        "--preset",
        "tiny-offpolicy",
        "--staleness",
        "0,auto",
        "--correction",
        "tis",
    ]
    monkeypatch.setattr(bench_async.os, "sched_getaffinity", lambda pid: {0, 1})  # two cores on any machine
    assert bench_async.main(argv) == 0  # 10 s -> 6 s a step: 1.67x, over the 1.3x target
    # another preset's runs go to a directory of their own: cached runs of `tiny` are never reused for it
    assert {out for *_, out in started} == {tmp_path / "runs" / "bench-async-tiny-offpolicy"}
    assert [(name, preset) for name, _, preset, _, _ in started] == [
        ("sync", "tiny-offpolicy"),
        ("asyncauto", "tiny-offpolicy"),
    ]
    assert started[0][1] == ["learner.max_staleness=0"]  # the synchronous run needs no correction
    assert started[1][1] == ["learner.max_staleness=auto", "learner.correction=tis"]
    assert "learner.total_steps=16" in started[1][3]
    table = capsys.readouterr().out
    assert "| async (max_staleness auto, tis) | 10.0 | 1.67x |" in table and "| 0.36 -> 0.60 |" in table


@pytest.mark.parametrize(
    "staleness, message",
    [
        ("often", "an integer >= 0 or auto, got 'often'"),
        ("-2", "must be >= 0"),
        ("0", "at least one asynchronous"),
    ],
)
def test_a_bad_staleness_list_is_refused_naming_it(bench_async, staleness, message, capsys):
    with pytest.raises(SystemExit) as stop:
        bench_async.main(["--staleness", staleness])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
