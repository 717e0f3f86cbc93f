"""`sr1 plan` end to end: on a preset with a shipped profile, on a finished run's directory, and on bad input."""

from __future__ import annotations

import json

import pytest
import yaml

from sr1.cli import main as sr1_main
from sr1.plan.profile import PROFILES_DIR, load_profile
from tests.unit.sr1.test_plan_profile import write_run_dir

QUICK = ["--steps", "4", "--warmup", "1"]
# the 8xH100 preset shrunk so that a unit test simulates it in seconds (same shapes per trajectory)
SMALL_QWEN = [
    "learner.groups_per_step=16",
    "learner.ppo_mini_batch_size=40",
    "generators.max_inflight_groups=8",
]
H100_3B = ["--gpus", "8", "--gpu-kind", "h100", "--profile", "qwen2.5-3b-h100"]


def plan_json(capsys, *argv: str) -> dict:
    assert sr1_main(["plan", *argv, "--json", *QUICK]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_on_the_tiny_preset(capsys, tmp_path):
    png = tmp_path / "plan.png"
    out = plan_json(
        capsys, "tiny", "--gpus", "2", "--gpu-kind", "cpu", "--profile", "cpu-tiny", "--png", str(png)
    )
    assert [r["max_staleness"] for r in out["rows"]] == [0, 1, 2, 4]
    assert all(r["generator_gpus"] == 1 and r["learner_gpus"] == 1 for r in out["rows"])
    for row in out["rows"]:
        assert max(int(k) for k in row["staleness_histogram"]) <= row["max_staleness"]
        assert 0 < row["generator_busy"] <= 1 and 0 < row["learner_busy"] <= 1
    assert out["rows"][0]["speedup_vs_sync_split"] == 1.0
    assert out["recommended"]["steps_per_hour"] >= 0.98 * max(r["steps_per_hour"] for r in out["rows"])
    assert png.stat().st_size > 0


def test_plan_on_the_8xh100_preset_runs_every_split_that_fits(capsys):
    """16 groups per step run on 3, 5 or 6 learner ranks too (whole groups dealt by tokens); only the splits whose
    learner cannot hold a 7B model are excluded, with the reason."""
    out = plan_json(
        capsys,
        "qwen2.5-3b-8xh100",
        *SMALL_QWEN,
        "--gpus",
        "8",
        "--gpu-kind",
        "h100",
        "--profile",
        "qwen2.5-3b-h100",
        "--figure",
        "params_billion=7",
        "--bounds",
        "0,2",
    )
    by_split = {(r["generator_gpus"], r["max_staleness"]): r for r in out["rows"]}
    assert len(by_split) == 7 * 2
    assert (
        by_split[(5, 0)]["excluded"] is None and by_split[(5, 0)]["steps_per_hour"] > 0
    )  # 16 groups, 3 ranks
    assert by_split[(7, 2)]["excluded"].startswith("learner needs")  # 7B on one rank
    assert by_split[(4, 2)]["excluded"] is None and by_split[(4, 2)]["steps_per_hour"] > 0
    assert out["colocated_sync"]["steps_per_hour"] > 0
    assert out["profile"]["params_billion"]["source"] == "given on the command line"


def test_plan_on_a_run_directory(capsys, tmp_path):
    run_dir = write_run_dir(tmp_path / "run")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"device": "cpu", "packed/tokens_per_s": 9000.0}))
    out = plan_json(capsys, "tiny", "--gpus", "2", "--gpu-kind", "cpu", "--from-run", str(run_dir))
    assert str(run_dir) in out["profile"]["learner"]["tokens_per_s_per_rank"]["source"]
    assert out["recommended"] is not None
    out = plan_json(
        capsys,
        "tiny",
        "--gpus",
        "2",
        "--gpu-kind",
        "cpu",
        "--from-run",
        str(run_dir),
        "--learner-bench",
        str(bench),
    )
    assert out["profile"]["learner"]["tokens_per_s_per_rank"]["value"] == 9000.0


def test_plan_prints_a_table_with_sources(capsys):
    assert (
        sr1_main(["plan", "tiny", "--gpus", "2", "--gpu-kind", "cpu", "--profile", "cpu-tiny", *QUICK]) == 0
    )
    out = capsys.readouterr().out
    assert "recommended: 1 generator GPU(s), 1 learner GPU(s)" in out
    rate = load_profile("cpu-tiny").learner.tokens_per_s_per_rank
    assert f"learner.tokens_per_s_per_rank = {rate.value:g}" in out and rate.source in out.replace("\n", " ")


def test_bad_input_is_refused_with_the_reason(capsys, tmp_path):
    def refused(*argv: str) -> str:
        assert sr1_main(["plan", *argv, *QUICK]) == 2
        return capsys.readouterr().err

    assert "unknown GPU kind 'tpu'; known: h100, h200, a100-80gb" in refused(
        "tiny", "--gpus", "2", "--gpu-kind", "tpu", "--profile", "cpu-tiny"
    )
    assert "give a profile" in refused("tiny", "--gpus", "2", "--gpu-kind", "cpu")
    data = yaml.safe_load((PROFILES_DIR / "cpu-tiny.yaml").read_text())
    del data["learner"]["tokens_per_s_per_rank"]
    partial = tmp_path / "partial.yaml"
    partial.write_text(yaml.safe_dump(data))
    assert "missing number learner.tokens_per_s_per_rank" in refused(
        "tiny", "--gpus", "2", "--gpu-kind", "cpu", "--profile", str(partial)
    )
    assert "no figure 'learner.speed'" in refused(
        "tiny", "--gpus", "2", "--gpu-kind", "cpu", "--profile", "cpu-tiny", "--figure", "learner.speed=3"
    )
    assert "expected KEY=NUMBER" in refused(
        "tiny", "--gpus", "2", "--gpu-kind", "cpu", "--profile", "cpu-tiny", "--figure", "weight_sync_s"
    )
    assert "--gpus must be at least 1" in refused(
        "tiny", "--gpus", "0", "--gpu-kind", "cpu", "--profile", "cpu-tiny"
    )
    assert "learner.nope" in refused(
        "tiny", "learner.nope=1", "--gpus", "2", "--gpu-kind", "cpu", "--profile", "cpu-tiny"
    )
    assert "no config.yaml" in refused(
        "tiny", "--gpus", "2", "--gpu-kind", "cpu", "--from-run", str(tmp_path)
    )


def test_no_split_fits_exits_1_with_the_reasons(capsys):
    argv = [
        "plan",
        "qwen2.5-3b-8xh100",
        *SMALL_QWEN,
        "--gpus",
        "2",
        "--gpu-kind",
        "a100-40gb",
        "--profile",
        "qwen2.5-3b-h100",
        *QUICK,
    ]
    assert sr1_main(argv) == 1
    out = capsys.readouterr().out
    assert "excluded: learner needs" in out and "no split can run this config" in out


def _calibration_harness(monkeypatch):
    """scripts/bench/calibrate_plan.py, imported as a module."""
    from scripts.bench import calibrate_plan

    return calibrate_plan


def test_calibration_harness_predicts_every_case(tmp_path, capsys, monkeypatch):
    calibrate = _calibration_harness(monkeypatch)
    assert calibrate.main(["--recorded", "--out", str(tmp_path), "--steps", "8"]) in (0, 1)
    rows = json.loads((tmp_path / "calibration.json").read_text())["rows"]
    assert [r["case"] for r in rows] == ["sync", "async1", "async2", "async4"]
    assert "| bench_async: sync (max_staleness 0) | 62.3 (61.0 / 63.3 / 62.5)" in capsys.readouterr().out
    profile = calibrate.load_profile("cpu-tiny")
    one, two = (
        calibrate.predict(c, profile, 6, 1, [], tmp_path)
        for c in calibrate.CASES
        if c.name in ("sync", "e2s0")
    )
    assert two["steps_per_min"] > 0 and one["steps_per_min"] > 0


def test_each_case_runs_pass_after_pass_and_its_medians_are_compared(tmp_path, capsys, monkeypatch):
    calibrate = _calibration_harness(monkeypatch)
    ran = []
    speeds = {"sync": [60.0, 80.0, 64.0], "async2": [90.0, 100.0, 140.0]}  # one slow or fast run each

    learner = calibrate.load_profile("cpu-tiny").learner.tokens_per_s_per_rank.value

    def measure(case, args, extra, name):
        ran.append(name)
        speed = speeds[case.name][sum(r.startswith(case.name) for r in ran) - 1]
        measured = {"steps_per_min": speed, "learner_busy": 0.9, "generator_busy": 0.5}
        if case.name == "async2":  # its learner ran twice as fast as the profile's
            measured["learner_tokens_per_s"] = 2 * learner
        return measured, tmp_path / name

    monkeypatch.setattr(calibrate, "measure", measure)
    benches = []
    monkeypatch.setattr(
        calibrate, "bench_engine", lambda core, curve, engines, seed, path: benches.append(path.name) or path
    )
    args = [
        "--cases",
        "sync,async2",
        "--repeats",
        "3",
        "--steps",
        "6",
        "--warmup",
        "1",
        "--out",
        str(tmp_path),
    ]
    calibrate.main(args)
    # pass after pass, each run in its own directory
    assert ran == ["sync-r1", "async2-r1", "sync-r2", "async2-r2", "sync-r3", "async2-r3"]
    assert benches == [
        "engine-curve-1.json",
        "engine-curve-1-r2.json",
        "engine-curve-1-r3.json",
    ]  # one per pass
    rows = {r["case"]: r for r in json.loads((tmp_path / "calibration.json").read_text())["rows"]}
    assert rows["sync"]["measured"]["steps_per_min"] == 64.0  # the median, not the mean
    assert rows["async2"]["measured"]["runs"]["steps_per_min"] == [90.0, 100.0, 140.0]
    predicted = rows["async2"]["predicted"]["steps_per_min"]
    assert rows["async2"]["error"] == pytest.approx(predicted / 100.0 - 1)
    assert "| bench_async: max_staleness 2 | 100.0 (90.0 / 100.0 / 140.0) |" in capsys.readouterr().out
    # the same case predicted at the learner rate its runs had: a learner-bound pipeline runs faster, and the error
    # beside it is measured against the same medians; a run without the rate gets none
    at_rate = rows["async2"]["predicted"]["at_run_learner_steps_per_min"]
    assert at_rate > 1.3 * predicted
    assert rows["async2"]["error_at_run_learner"] == pytest.approx(at_rate / 100.0 - 1)
    assert rows["sync"]["error_at_run_learner"] is None
    with pytest.raises(SystemExit):
        calibrate.main([*args, "--repeats", "0"])
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err


def test_engines_sharing_a_core_get_the_curve_measured_beside_each_other(tmp_path, monkeypatch):
    calibrate = _calibration_harness(monkeypatch)
    profile = calibrate.with_engine_curve(calibrate.load_profile("cpu-tiny"), [(8.0, 2000.0), (64.0, 9000.0)])
    solo, shared = tmp_path / "engine-curve-1.json", tmp_path / "engine-curve-2.json"
    # without the benches: the assumption, each of two engines gets half the core
    halves = calibrate.shared_core(profile, solo, shared, 2)
    assert [y for _, y in halves.generator.tokens_per_s.points] == [1000.0, 4500.0]
    assert halves.weight_sync_s.value == pytest.approx(2 * profile.weight_sync_s.value)
    solo.write_text(json.dumps({"engine_curve": [[4, 500.0], [64, 8000.0]]}))
    shared.write_text(json.dumps({"engine_curve": [[4, 200.0], [64, 3200.0]]}))  # 0.4 of alone at both ends
    measured = calibrate.shared_core(profile, solo, shared, 2)
    assert [y for _, y in measured.generator.tokens_per_s.points] == pytest.approx([800.0, 3600.0])
    # the generator core's other seconds stretch by the same share
    for figure in ("weight_sync_s", "handoff_s"):
        assert getattr(measured, figure).value == pytest.approx(getattr(profile, figure).value / 0.4)
    latency = measured.workload.search_latency_s
    assert latency.value == pytest.approx(profile.workload.search_latency_s.value / 0.4)
    assert "0.40, the engine's share of the core" in latency.source


def test_overrides_may_follow_the_options(capsys):
    common = ["tiny", "--gpus", "2", "--gpu-kind", "cpu", "--profile", "cpu-tiny", "--bounds", "0"]
    eight = plan_json(capsys, *common)
    four = plan_json(capsys, *common, "learner.groups_per_step=4")
    assert four["rows"][0]["step_s"] < eight["rows"][0]["step_s"]  # half the groups per step: shorter steps


def test_the_table_compares_every_split_with_search_r1_as_it_runs(capsys):
    assert sr1_main(["plan", "qwen2.5-3b-8xh100", *SMALL_QWEN, *H100_3B, "--bounds", "0", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "vs Search-R1 as it runs" in out and "vs colocated sync" in out
    assert "Search-R1 as it runs (veRL's synchronous multi-turn loop on all 8 GPUs" in out
    assert "calibrated: search_r1.trainer_mfu = " in out
    slow_worker = ["--figure", "generator.worker_tokens_per_s=2000"]
    assert (
        sr1_main(["plan", "qwen2.5-3b-8xh100", *SMALL_QWEN, *H100_3B, "--bounds", "0", *slow_worker, *QUICK])
        == 0
    )
    out = capsys.readouterr().out
    assert "worker-bound: with 1 gen / 7 learn" in out and "(2,000 tokens/s" in out


def test_a_retrieval_curve_from_a_bench_or_inline_makes_searches_queue(capsys, tmp_path):
    bench = tmp_path / "retrieval.json"
    curves = {"dense_flat/naive": [[1, 2.0], [16, 2.0]], "dense_flat/batched": [[1, 40.0], [64, 1450.0]]}
    bench.write_text(json.dumps({"retrieval_curves": curves, "date": "2026-11-26T15:00", "machine": "test"}))
    common = ["qwen2.5-3b-8xh100", *SMALL_QWEN, *H100_3B, "--bounds", "1"]
    naive = plan_json(
        capsys, *common, "--retrieval-bench", str(bench), "--retrieval-server", "dense_flat/naive"
    )
    assert naive["profile"]["retrieval"]["requests_per_s"]["points"] == [[1.0, 2.0], [16.0, 2.0]]
    assert "dense_flat/naive" in naive["profile"]["retrieval"]["requests_per_s"]["source"]
    inline = plan_json(capsys, *common, "--retrieval-curve", "1:2,16:2")
    batched = plan_json(
        capsys, *common, "--retrieval-bench", str(bench), "--retrieval-server", "dense_flat/batched"
    )
    for slow, fast in zip(naive["rows"], batched["rows"], strict=True):
        assert slow["search_wait_s"] > fast["search_wait_s"] and slow["step_s"] > fast["step_s"]
    assert [r["step_s"] for r in inline["rows"]] == [r["step_s"] for r in naive["rows"]]
    assert sr1_main(["plan", *common, "--retrieval-bench", str(bench), *QUICK]) == 2
    assert "several curves; give --retrieval-server with one of: dense_flat/naive" in capsys.readouterr().err
    assert sr1_main(["plan", *common, "--retrieval-curve", "1-2", *QUICK]) == 2
    assert "expected N:RATE pairs" in capsys.readouterr().err


def test_the_search_r1_fit_replaces_the_figure_and_says_so(capsys):
    argv = ["search-r1-grpo-8xh100", *SMALL_QWEN, *H100_3B, "--bounds", "0"]
    out = plan_json(capsys, *argv, "--fit-search-r1", "90")
    mfu = out["profile"]["search_r1"]["trainer_mfu"]
    assert mfu["source"].startswith("fitted") and "--fit-search-r1 90" in mfu["source"]
    assert out["search_r1"]["step_s"] == pytest.approx(90, rel=0.01)
    assert out["search_r1"]["fitted"] == [f"search_r1.trainer_mfu = {mfu['value']:g}"]
    assert sr1_main(["plan", *argv, "--fit-search-r1", "-1", *QUICK]) == 2
    assert "--fit-search-r1 must be a number of seconds > 0" in capsys.readouterr().err
