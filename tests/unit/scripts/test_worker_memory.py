"""scripts/bench/worker_memory.py's growth figure, from samples (the measurement itself: tests/integration/test_worker_memory.py)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def worker_memory():
    from scripts.bench import worker_memory

    return worker_memory


def test_growth_needs_two_samples_after_the_warm_up(worker_memory):
    samples = [{"update": 0, "rss_mib": 1.0}, {"update": 150, "rss_mib": 2.0}]
    with pytest.raises(ValueError, match="fewer than two samples after the warm-up of 150"):
        worker_memory.growth(samples, warmup=150)
    assert worker_memory.growth(samples, warmup=0)["rss_mib"] == {
        "mib": 1.0,
        "mib_per_1000_updates": pytest.approx(1000 / 150),
    }


def test_arguments_that_leave_nothing_to_compare_are_refused(worker_memory, capsys):
    with pytest.raises(SystemExit):
        worker_memory.main(["--updates", "200", "--every", "100", "--warmup", "150"])
    assert "exceeds --updates 200" in capsys.readouterr().err


def test_saved_runs_are_drawn_into_one_figure_and_a_wrong_file_is_named(worker_memory, tmp_path, capsys):
    runs = []
    for kept in (True, False):
        samples = [
            {"update": u, "rss_mib": 100.0 + u * (0.1 if kept else 0.01), "in_use_mib": 80.0}
            for u in (0, 10, 20)
        ]
        path = tmp_path / f"run-{kept}.json"
        path.write_text(json.dumps({"args": {"keep_freed_heap": str(kept)}, "samples": samples}))
        runs.append(path)
    png = tmp_path / "both.png"
    assert worker_memory.main(["--plot", *map(str, runs), "--png", str(png), "--warmup", "10"]) == 0
    assert png.stat().st_size > 10_000
    bad = tmp_path / "bad.json"
    bad.write_text('{"samples": []}')
    with pytest.raises(SystemExit):
        worker_memory.main(["--plot", str(bad), "--png", str(png)])
    assert "bad.json: not a saved run of this script (no 'args' and 'samples')" in capsys.readouterr().err
