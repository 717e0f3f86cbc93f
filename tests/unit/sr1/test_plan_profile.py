"""Profiles of `sr1 plan`: files, a finished run's measurements, a learner benchmark, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from config import load_config, save_config
from sr1.plan.measured import profile_from_run, resolve_profile
from sr1.plan.profile import (
    GPU_KINDS,
    ProfileError,
    check_memory,
    gpu_kind,
    list_profiles,
    load_profile,
    with_engine_curve,
    with_figures,
)
from sr1.plan.simulate import simulate
from sr1.plan.splits import pipeline

# one step row as learner/loop.py writes it to metrics.jsonl (the keys the profile reads, and a few others)
STEP = {
    "loss/pg": 0.01,
    "batch/groups": 8,
    "batch/loss_tokens": 1600,
    "batch/tool_calls_per_traj": 1.0,
    "batch/response_len_mean": 82.0,
    "batch/reward_mean": 0.5,
    "perf/train_s": 0.74,
    "perf/tokens_per_s": 20000.0,
    "perf/step_s": 1.30,
    "perf/wait_s": 0.50,
    "weight_sync/seconds": 0.02,
    "tools/latency_s": 0.015,
    "learner/version": 1,
    "pool/generators": 1,
    "pool/idle_fraction": 0.5,
}
BUSY_S_PER_STEP = (
    0.4  # the pool's cumulative busy seconds grow by this much per 1.30 s step: busy 0.31 of the time
)


def write_run_dir(run_dir: Path, steps: int = 5, overrides: tuple[str, ...] = ()) -> Path:
    """A finished tiny run's directory in the layout `sr1 run` writes: config.yaml, metrics.jsonl (a segment marker,
    step rows, an evaluation row), learner_groups.jsonl."""
    save_config(load_config("tiny", [f"run_dir={run_dir}", *overrides]), run_dir)
    lines = [{"segment": {"start": 0, "resumed_from": None, "weights": 0, "time": 1000.0}}]
    lines.append({"eval_step": 0, "time": 1000.5, "eval/em": 0.3})
    groups = [{"start": 0, "resumed_from": None, "weights": 0, "recalled": []}]
    for step in range(1, steps + 1):
        first_wait = 3.0 if step == 1 else 0.0  # the first step waits for a cold system: left out
        row = STEP | {
            "learner/version": step,
            "perf/wait_s": STEP["perf/wait_s"] + first_wait,
            "perf/step_s": STEP["perf/step_s"] + first_wait,
            "pool/busy_s": 2.0 + BUSY_S_PER_STEP * step,
            "pool/uptime_s": 10.0 + STEP["perf/step_s"] * step,
        }
        if step % 4 == 0:  # a checkpoint's time is part of its step's
            row |= {"perf/checkpoint_s": 0.1, "perf/step_s": row["perf/step_s"] + 0.1}
        lines.append({"step": step, "time": 1000.0 + 1.3 * step} | row)
        groups.append({"version": step, "group_ids": [f"tinykb/train/{step * 8 + i}/e0" for i in range(8)]})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run_dir / "learner_groups.jsonl").write_text("".join(json.dumps(x) + "\n" for x in groups))
    return run_dir


def test_shipped_profiles_load_and_name_every_source():
    assert {"cpu-tiny", "qwen2.5-3b-h100"} <= set(list_profiles())
    for name in list_profiles():
        profile = load_profile(name)
        assert profile.gpu_kind in GPU_KINDS
        assert profile.generator.tokens_per_s.source and profile.learner.tokens_per_s_per_rank.source


def test_the_projection_says_what_is_measured_and_what_is_assumed():
    """The learner's figure is the one in the raw benchmark output it names (docs/measurements/), and says on which
    GPU it was measured; the generator's curve and the publish time say they are assumptions."""
    profile = load_profile("qwen2.5-3b-h100")
    learner = profile.learner.tokens_per_s_per_rank
    assert learner.source.startswith("measured") and "NVIDIA H200" in learner.source
    raw = (
        Path(__file__).resolve().parents[3]
        / "docs/measurements/bench_learner-qwen2.5-3b-h200-2026-11-26.json"
    )
    bench = json.loads(raw.read_text())
    assert bench["gpu"] == "NVIDIA H200" and bench["shape"] == "qwen2.5-3b"
    assert learner.value == round(bench["packed/tokens_per_s"])
    assert profile.generator.tokens_per_s.source.startswith("assumption")
    assert profile.weight_sync_s.source.startswith("assumption")


def test_a_profile_missing_a_number_names_it(tmp_path):
    data = yaml.safe_load(Path(load_profile.__globals__["PROFILES_DIR"], "cpu-tiny.yaml").read_text())
    del data["generator"]["prefill_cost"]
    del data["workload"]["search_latency_s"]["source"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert "missing number generator.prefill_cost" in str(err.value)
    assert "workload.search_latency_s.source" in str(err.value)


def test_unknown_profile_and_gpu_kind_list_the_known_ones():
    with pytest.raises(ProfileError, match="shipped profiles: cpu-tiny"):
        load_profile("no-such-profile")
    with pytest.raises(ProfileError, match="known: h100, h200"):
        gpu_kind("h1000")


def test_a_split_that_cannot_hold_the_model_says_why():
    profile = with_figures(load_profile("qwen2.5-3b-h100"), {"params_billion": 7.0})
    h100 = gpu_kind("h100")
    flags = {"tensor_parallel": 1, "gpu_memory_utilization": 0.85, "reference": True, "critic": False}
    # 7B x (16 bytes of training state + 4 of the reference's fp32 shards) + 3.7 GiB of activations
    assert "learner needs 134.1 GiB per rank on 1 rank(s), more than 80 GiB" in check_memory(
        profile, h100, ranks=1, **flags
    )
    assert check_memory(profile, h100, ranks=2, **flags) is None
    big = with_figures(profile, {"params_billion": 30.0})
    assert "engine needs" in check_memory(big, h100, ranks=16, **flags)
    assert check_memory(big, gpu_kind("cpu"), ranks=1, **flags) is None  # memory is not checked on CPU cores


def test_with_figures_replaces_a_figure_and_refuses_unknown_names():
    profile = with_figures(load_profile("cpu-tiny"), {"learner.tokens_per_s_per_rank": 123.0}, source="me")
    assert profile.learner.tokens_per_s_per_rank.value == 123.0
    assert profile.learner.tokens_per_s_per_rank.source == "me"
    with pytest.raises(ProfileError, match="no figure 'learner.nope'"):
        with_figures(profile, {"learner.nope": 1.0})


def test_profile_from_a_run_directory(tmp_path):
    run_dir = write_run_dir(tmp_path / "run")
    profile = profile_from_run(run_dir, load_profile("cpu-tiny"))
    w = profile.workload
    assert w.searches_per_trajectory.value == pytest.approx(1.0)
    assert w.tokens_per_turn.value == pytest.approx(1600 / 64 / 2)
    assert w.obs_tokens_per_search.value == pytest.approx(82 - 25)
    assert w.prompt_tokens.value == pytest.approx(20000 * 0.74 / 64 - 82)
    assert profile.learner.tokens_per_s_per_rank.value == pytest.approx(20000)
    assert profile.learner.step_overhead_s.value == pytest.approx(1.30 - 0.50 - 0.74 - 0.02)
    assert profile.learner.checkpoint_s.value == pytest.approx(0.1)
    assert profile.weight_sync_s.value == pytest.approx(0.02)
    assert "fitted to" in profile.generator.tokens_per_s.source
    assert profile.workload.search_latency_s.value == pytest.approx(0.015)
    assert "tools/latency_s" in profile.workload.search_latency_s.source
    # what a run cannot measure keeps the file's figure and its source
    assert profile.generator.prefill_cost == load_profile("cpu-tiny").generator.prefill_cost


@pytest.mark.parametrize("max_staleness", [0, 2])
def test_the_engine_rate_is_fitted_to_the_pools_busy_share(tmp_path, max_staleness):
    """Simulated with the measured profile, the run's own configuration keeps its engine busy for the share of the
    time the heartbeats measured; a synchronous run also gives the hand-off (its wait less the time in flight)."""
    overrides = (f"learner.max_staleness={max_staleness}",)
    run_dir = write_run_dir(tmp_path / "run", steps=8, overrides=overrides)
    defaults = with_engine_curve(load_profile("cpu-tiny"), [(1.0, 1.0)])  # one point: no shape to keep
    profile = profile_from_run(run_dir, defaults)
    measured = BUSY_S_PER_STEP / STEP["perf/step_s"]
    cfg = load_config("tiny", list(overrides))
    pipe = pipeline(cfg, engines=1, ranks=1, max_staleness=max_staleness)
    simulated = simulate(pipe, profile, steps=8, warmup=1).generator_busy
    assert simulated == pytest.approx(measured, abs=0.01)
    ((concurrency, rate),) = profile.generator.tokens_per_s.points
    assert concurrency == min(pipe.max_num_seqs, pipe.max_inflight_groups * pipe.group_size)
    if max_staleness == 0:
        mean_step = (5 * 1.30 + 2 * 1.40) / 7  # steps 2-8 measured; 4 and 8 carry a checkpoint's 0.1 s
        assert profile.handoff_s.value == pytest.approx(0.50 - measured * mean_step)
        assert "synchronous" in profile.handoff_s.source
    else:
        assert profile.handoff_s == defaults.handoff_s  # an asynchronous run cannot tell hand-offs apart
    # a slower engine in the same run would have been busier: the fit moves the right way
    slower = with_engine_curve(profile, [(concurrency, rate / 2)])
    assert simulate(pipe, slower, steps=8, warmup=1).generator_busy > simulated


def test_a_measured_engine_curve_keeps_its_shape_and_the_run_fits_its_scale(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", steps=8)
    shape = [(4.0, 1000.0), (32.0, 5000.0), (128.0, 8000.0)]
    defaults = with_engine_curve(
        load_profile("cpu-tiny"), shape, "bench_generators.py --curve in engine.json"
    )
    profile = profile_from_run(run_dir, defaults)
    points = profile.generator.tokens_per_s.points
    assert [x for x, _ in points] == [x for x, _ in shape]
    scale = points[-1][1] / shape[-1][1]
    assert [y / scale for _, y in points] == pytest.approx([y for _, y in shape])
    assert "the shape of bench_generators.py --curve" in profile.generator.tokens_per_s.source
    cfg = load_config("tiny")
    pipe = pipeline(cfg, engines=1, ranks=1, max_staleness=cfg.learner.max_staleness)
    busy = simulate(pipe, profile, steps=8, warmup=1).generator_busy
    assert busy == pytest.approx(BUSY_S_PER_STEP / STEP["perf/step_s"], abs=0.01)


def test_engine_bench_output_replaces_the_engine_curve(tmp_path):
    bench = tmp_path / "engine.json"
    curve = [[4, 1200.0], [32, 6100.0], [128, 9000.0]]
    bench.write_text(
        json.dumps({"engine_curve": curve, "device": "cpu: Xeon", "model": "m", "date": "2026-11-25"})
    )
    profile = resolve_profile("cpu-tiny", engine_bench=bench)
    assert [list(p) for p in profile.generator.tokens_per_s.points] == curve
    assert "bench_generators.py --curve" in profile.generator.tokens_per_s.source
    assert "cpu: Xeon" in profile.generator.tokens_per_s.source
    # with a run, the bench gives the shape and the run the scale
    fitted = resolve_profile(from_run=write_run_dir(tmp_path / "run"), engine_bench=bench)
    ratios = [y / y0 for (_, y), (_, y0) in zip(fitted.generator.tokens_per_s.points, curve, strict=True)]
    assert ratios == pytest.approx([ratios[0]] * 3)
    bad = tmp_path / "bad.json"
    for text, match in [
        ("not json", "not a bench_generators.py --curve 8,32,128 --json output"),
        (json.dumps({"agent_tokens_per_s": 1.0}), "no 'engine_curve'"),
        (json.dumps({"engine_curve": [[32, 10.0], [4, 5.0]]}), "generator.tokens_per_s"),
    ]:
        bad.write_text(text)
        with pytest.raises(ProfileError, match=match):
            resolve_profile("cpu-tiny", engine_bench=bad)


def _rewrite_rows(run_dir: Path, change) -> None:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if "step" in r:
            change(r)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_run_directory_errors_name_the_problem(tmp_path):
    with pytest.raises(ProfileError, match="no config.yaml"):
        profile_from_run(tmp_path)
    run_dir = write_run_dir(tmp_path / "one", steps=1)
    with pytest.raises(ProfileError, match="at least 2 step rows"):
        profile_from_run(run_dir)
    run_dir = write_run_dir(tmp_path / "old")
    _rewrite_rows(run_dir, lambda r: r.pop("batch/groups"))
    with pytest.raises(ProfileError, match="a step row has no batch/groups"):
        profile_from_run(run_dir)


def test_the_pools_heartbeat_figures_must_be_there_and_advance(tmp_path):
    defaults = load_profile("cpu-tiny")
    run_dir = write_run_dir(tmp_path / "old")
    _rewrite_rows(run_dir, lambda r: r.pop("pool/busy_s"))
    with pytest.raises(ProfileError, match="a step row has no pool/busy_s"):
        profile_from_run(run_dir, defaults)
    run_dir = write_run_dir(tmp_path / "still")
    _rewrite_rows(run_dir, lambda r: r.update({"pool/uptime_s": 10.0, "pool/busy_s": 2.0}))
    with pytest.raises(ProfileError, match="did not advance between step 2 and step 5"):
        profile_from_run(run_dir, defaults)
    run_dir = write_run_dir(tmp_path / "restarted")
    _rewrite_rows(run_dir, lambda r: r.update({"pool/busy_s": 10.0 - r["step"]}))
    with pytest.raises(ProfileError, match="a generator restarted"):
        profile_from_run(run_dir, defaults)
    run_dir = write_run_dir(tmp_path / "impossible")  # less busy than its searches alone would keep it
    _rewrite_rows(run_dir, lambda r: r.update({"pool/busy_s": 0.001 * r["step"]}))
    with pytest.raises(ProfileError, match="no engine rate reproduces"):
        profile_from_run(run_dir, defaults)


def test_a_run_with_dynamic_sampling_measures_the_dropped_share(tmp_path):
    run_dir = write_run_dir(tmp_path / "run")
    save_config(
        load_config("tiny", [f"run_dir={run_dir}", "learner.algorithm.dynamic_sampling=true"]), run_dir
    )
    _rewrite_rows(
        run_dir,
        lambda r: r.update({"buffer/produced": 10 * r["step"], "buffer/dropped_groups": 3 * r["step"]}),
    )
    profile = profile_from_run(run_dir, load_profile("cpu-tiny"))
    assert profile.workload.dropped_group_fraction.value == pytest.approx(0.3)
    assert "buffer/dropped_groups" in profile.workload.dropped_group_fraction.source


def test_learner_bench_output_replaces_the_learner_figure(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(
        json.dumps(
            {
                "device": "cuda:0",
                "gpu": "NVIDIA H200",
                "shape": "qwen2.5-3b",
                "micro_batch_tokens": 16384,
                "mean_seq_len": 700.0,
                "packed/tokens_per_s": 5730.0,
                "padded/tokens_per_s": 4000.0,
            }
        )
    )
    profile = resolve_profile("cpu-tiny", learner_bench=bench)
    assert profile.learner.tokens_per_s_per_rank.value == 5730.0
    source = profile.learner.tokens_per_s_per_rank.source
    assert "bench_learner.py --json" in source and "NVIDIA H200, qwen2.5-3b" in source
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"device": "cpu"}))
    with pytest.raises(ProfileError, match="packed/tokens_per_s"):
        resolve_profile("cpu-tiny", learner_bench=bad)
    with pytest.raises(ProfileError, match="give a profile"):
        resolve_profile(learner_bench=bench)


def test_figures_out_of_range_are_refused():
    profile = load_profile("cpu-tiny")
    with pytest.raises(ProfileError, match="learner.tokens_per_s_per_rank must be > 0, got 0"):
        with_figures(profile, {"learner.tokens_per_s_per_rank": 0})
    with pytest.raises(ProfileError, match="workload.search_latency_s must be >= 0, got -1"):
        with_figures(profile, {"workload.search_latency_s": -1})
    with pytest.raises(ProfileError, match="dropped_group_fraction must be < 1"):
        with_figures(profile, {"workload.dropped_group_fraction": 1})
