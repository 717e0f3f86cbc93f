"""Sweeps: what `read_run` takes from a finished run (report.json and metrics.jsonl), and the staleness comparison's
settings and table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sr1.sweep import Case, RunFailed, mean_std, parse_bounds, read_run, run_case


def _fake_run(run_dir: Path, em_before: float, em_after: float) -> None:
    run_dir.mkdir(parents=True)
    report = {
        "em_before": em_before,
        "em_after": em_after,
        "step_s_mean": 2.0,
        "wall_s": 80.0,
        "learner_idle_fraction": 0.1,
        "generator_idle_fraction": 0.5,
        "evals": [{"step": 0, "eval/em": em_before}, {"step": 40, "eval/em": em_after}],
        "staleness_histogram": {"0": 30, "1": 10},
    }
    (run_dir / "report.json").write_text(json.dumps(report))
    rows = [
        {"eval_step": 0, "time": 1000.0, "eval/em": em_before},
        {"step": 1, "time": 1010.0},
        {"eval_step": 40, "time": 1090.5, "eval/em": em_after},
    ]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_read_run_takes_the_curves_against_steps_and_wall_time(tmp_path):
    _fake_run(tmp_path / "run", 0.25, 0.5)
    run = read_run(tmp_path / "run")
    assert run["curve"] == [(0, 0.25), (40, 0.5)]
    assert run["curve_wall"] == [(0.0, 0.25), (90.5, 0.5)]
    assert run["staleness_histogram"] == {0: 30, 1: 10}
    assert (run["em_before"], run["em_after"], run["learner_idle"]) == (0.25, 0.5, 0.1)


def test_a_finished_run_is_not_run_again_and_a_failed_one_names_its_log(tmp_path):
    _fake_run(tmp_path / "done-s3", 0.1, 0.2)
    assert run_case(Case("done", "done"), 3, tmp_path) == tmp_path / "done-s3"  # no sr1 run started
    with pytest.raises(RunFailed, match="bad-s0.log"):
        run_case(Case("bad", "bad", ["no_such_section.x=1"]), 0, tmp_path)


def test_a_run_cut_off_before_its_report_starts_again_from_scratch(tmp_path):
    cut = tmp_path / "bad-s0"
    cut.mkdir()
    (cut / "evals.jsonl").write_text('{"step": 0, "eval/em": 0.3}\n')  # what an interrupted run leaves
    with pytest.raises(RunFailed):
        run_case(Case("bad", "bad", ["no_such_section.x=1"]), 0, tmp_path)
    assert not (cut / "evals.jsonl").exists()


def test_mean_std():
    assert mean_std([0.5]) == "0.50"
    assert mean_std([0.2, 0.4]) == "0.30 ± 0.14"


def test_staleness_settings_run_sync_once_and_tabulate_gains(tmp_path):
    import scripts.bench.compare_staleness as compare_staleness

    cases = compare_staleness.cases([0, 2], ["none", "tis"])
    assert [c.name for c in cases] == ["s0-none", "s2-none", "s2-tis"]
    _fake_run(tmp_path / "r", 0.25, 0.5)
    table = compare_staleness.summarize(cases, {"s2-tis": {0: read_run(tmp_path / "r")}})
    assert "| max_staleness 2, tis | 0.25 | 0.50 | +0.25 |" in table and "s0" not in table


def test_staleness_comparison_takes_auto_and_tabulates_the_off_policy_diagnostics(tmp_path):
    """`--staleness 0,8,auto`: auto is a setting of its own; each run's per-step mismatch KL, ESS, clipped share and
    bound in force (metrics.jsonl) reach the table and the plots."""
    import scripts.bench.compare_staleness as compare_staleness

    assert parse_bounds("0, 8,auto,auto:1-16") == [0, 8, "auto", "auto:1-16"]
    assert compare_staleness.cases(["auto:1-16"], ["none"])[0].overrides == [
        "learner.max_staleness=auto",
        "learner.max_staleness.auto.floor=1",
        "learner.max_staleness.auto.ceiling=16",
        "learner.correction=none",
    ]
    for bad in ("-1", "often", "auto:4-2"):
        with pytest.raises(ValueError):
            parse_bounds(bad)
    cases = compare_staleness.cases([0, 8, "auto"], ["none", "tis"])
    assert [c.name for c in cases] == ["s0-none", "s8-none", "s8-tis", "auto-none", "auto-tis"]
    assert cases[3].overrides == ["learner.max_staleness=auto", "learner.correction=none"]
    results: dict = {}
    for name, seed, kls, bounds in (
        ("s8-none", 0, (0.01, 0.3), (8, 8)),
        ("auto-tis", 0, (0.01, 0.02), (0, 1)),
        ("auto-tis", 1, (0.03, 0.04), (0, 2)),
    ):
        run_dir = tmp_path / f"{name}-s{seed}"
        _fake_run(run_dir, 0.3, 0.6 if name == "auto-tis" else 0.4)
        with open(run_dir / "metrics.jsonl", "a") as f:
            for step, (kl, bound) in enumerate(zip(kls, bounds, strict=True), start=2):
                f.write(
                    json.dumps(
                        {
                            "step": step,
                            "time": 1020.0 + step,
                            "loss/offpolicy_kl": kl,
                            "loss/mismatch_kl": kl,
                            "loss/is_ess": 1 - kl,
                            "loss/clipped_frac": 0.1,
                            "staleness/bound": bound,
                        }
                    )
                    + "\n"
                )
        results.setdefault(name, {})[seed] = read_run(run_dir)
    assert [c["bound"] for c in results["auto-tis"][1]["offpolicy"]] == [0, 2]
    table = compare_staleness.summarize(cases, results)
    assert "| max_staleness 8, none | 0.30 | 0.40 | +0.10 | 0.40-0.40 |" in table
    assert (
        "| 0.1550 | 0.845 | 0.700 | 0.100 | 8-8 |" in table
    )  # KL, ESS mean and lowest, clipped, bounds of s8
    assert "| max_staleness auto, tis | 0.30 ± 0.00 | 0.60 ± 0.00 | +0.30, +0.30 | 0.60-0.60 |" in table
    assert table.rstrip().endswith("| 0-2 |")
    compare_staleness.plot(cases, results, tmp_path)
    for name in ("em_vs_time.png", "em_vs_step.png", "offpolicy.png", "staleness.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
