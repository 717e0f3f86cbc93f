"""The run report: JSON and markdown figures agree, plots are real PNGs, torn metrics lines are skipped."""

from __future__ import annotations

import json

from sr1.report import RunSummary, read_metrics, staleness_stats, write_report


def _summary(tmp_path) -> RunSummary:
    return RunSummary(
        run_dir=str(tmp_path),
        preset="tiny",
        seed=0,
        max_staleness=2,
        correction="tis",
        algorithm="grpo",
        steps=3,
        wall_s=12.5,
        em_before=0.2,
        em_after=0.45,
        evals=[
            {"step": 0, "eval/version": 0, "eval/em": 0.2},
            {"step": 3, "eval/version": 3, "eval/em": 0.45},
        ],
        reward_curve=[(1, 0.1), (2, 0.3), (3, 0.5)],
        staleness_histogram={0: 10, 1: 5, 2: 1},
    )


def test_report_files(tmp_path):
    json_path, md_path = write_report(_summary(tmp_path), tmp_path)
    data = json.loads(json_path.read_text())
    assert data["em_gain"] == 0.45 - 0.2
    assert data["staleness_histogram"] == {"0": 10, "1": 5, "2": 1}
    text = md_path.read_text()
    assert "| test EM before | 0.200 |" in text and "| EM gain | 0.250 |" in text
    for name in ("reward_em.png", "staleness.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in text


def test_staleness_stats():
    assert staleness_stats({0: 10, 1: 5, 2: 1}) == (7 / 16, 2)
    assert staleness_stats({}) == (None, None)


def test_read_metrics_skips_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"learner/st')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert read_metrics(tmp_path / "missing.jsonl") == []


def test_the_report_counts_dead_letters_by_reason_and_tool_errors(tmp_path):
    from sr1.report import dead_letter_counts, tool_totals

    stats = {
        "buffer/poison_prompts": 1,
        "buffer/failed_prompts": 2,
        "buffer/untrainable": 3,
        "buffer/abandoned_groups": 6,
    }
    rows = [
        {"step": 1, "tools/calls": 4, "tools/errors": 1, "tools/latency_s": 0.5},
        {"step": 2, "tools/calls": 0, "tools/errors": 0, "tools/latency_s": 0.0},
    ]
    calls, errors, latency = tool_totals(rows)
    assert (calls, errors, latency) == (4, 1, 0.5)
    summary = _summary(tmp_path)
    summary.dead_letters = dead_letter_counts(stats)
    summary.tool_calls, summary.tool_errors, summary.tool_latency_s = calls, errors, latency
    _, md_path = write_report(summary, tmp_path)
    text = md_path.read_text()
    assert (
        "| poison prompts (every lease expired) | 1 |" in text
        and "| failed prompts (every try raised) | 2 |" in text
    )
    assert (
        "| untrainable groups (over the learner's token budget) | 3 |" in text
        and "| malformed payloads | 0 |" in text
    )
    assert "| replaced by a new release | 6 |" in text
    assert (
        "| of which failed (error text instead of results) | 1 |" in text
        and "| mean tool latency | 0.500 s |" in text
    )


def test_the_report_and_the_live_view_show_the_off_policy_diagnostics(tmp_path, redis_url):
    """The per-step `loss/offpolicy_kl`, `loss/mismatch_kl`, `loss/is_ess`, clipped and masked shares and `staleness/bound` of
    metrics.jsonl reach the report (table and plot) and the live table, with the staleness histogram."""
    from types import SimpleNamespace

    from buffer.redis_buffer import ReplayBuffer
    from sr1.live import LiveView
    from sr1.report import offpolicy_curve

    rows = [
        {
            "step": s,
            "loss/offpolicy_kl": kl,
            "loss/mismatch_kl": 2 * kl,
            "loss/is_ess": ess,
            "loss/clipped_frac": 0.1,
            "loss/masked_frac": 0.0,
            "staleness/bound": bound,
            "staleness/mean": bound - 0.5,
        }
        for s, kl, ess, bound in ((1, 0.01, 0.99, 4), (2, 0.2, 0.6, 4), (3, 0.05, 0.9, 2))
    ] + [{"eval_step": 3, "eval/em": 0.4}]
    curve = offpolicy_curve(rows)
    assert [c["bound"] for c in curve] == [4, 4, 2] and curve[1]["is_ess"] == 0.6
    summary = _summary(tmp_path)
    summary.max_staleness, summary.offpolicy = "auto", curve
    _, md_path = write_report(summary, tmp_path)
    text = md_path.read_text()
    assert (
        "| off-policy KL per token (behaviour vs step start), mean / largest step | 0.0867 / 0.2000 |" in text
    )
    assert (
        "| mismatch KL per token (behaviour vs every update), mean / largest step | 0.1733 / 0.4000 |" in text
    )
    assert "| importance-weight ESS, mean / smallest step | 0.830 / 0.600 |" in text
    assert "| staleness bound in force, lowest / highest | 2 / 4 |" in text
    assert (tmp_path / "offpolicy.png").read_bytes()[
        :8
    ] == b"\x89PNG\r\n\x1a\n" and "](offpolicy.png)" in text

    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    buf = ReplayBuffer(redis_url, "live-offpolicy")
    buf.set_staleness_bound(0, 2)
    buf.record_consumed([0, 1, 1, 2])
    orch = SimpleNamespace(
        run_dir=tmp_path,
        started=0.0,
        buffer=buf,
        evals=[],
        cfg=SimpleNamespace(learner=SimpleNamespace(total_steps=3)),
    )
    snap = LiveView(orch, enabled=False).snapshot()
    assert snap["staleness mean/max (bound)"] == "1.50 / - (2; next releases 2)"
    assert snap["off-policy KL / mismatch KL / IS ESS"] == "0.0500 / 0.1000 / 0.900"
    assert snap["clipped / masked tokens"] == "0.100 / 0.000"
    assert snap["staleness of trained tokens"] == "0:25% 1:50% 2:25%"
    buf.close()


def test_the_report_counts_the_checkpoints_that_could_not_be_written(tmp_path):
    from sr1.report import checkpoint_failures

    lines = [
        {"segment": {"start": 0, "weights": 0, "time": 0.0}},
        {"step": 4, "checkpoint/failed_in_a_row": 0},
        {"step": 8, "checkpoint/failed_in_a_row": 1},  # training went on
        {"step": 9, "checkpoint/failed_in_a_row": 1},
        {"step": 12, "checkpoint/failed_in_a_row": 0},  # written again
        {"step": 16, "checkpoint/failed_in_a_row": 1},
        {"step": 20, "checkpoint/failed_in_a_row": 2},  # the run stopped with 74
        {"segment": {"start": 20, "weights": 12, "time": 1.0}},
        {"step": 16, "checkpoint/failed_in_a_row": 1},  # the resumed learner's own first failure
        {"step": 20, "checkpoint/failed_in_a_row": 0},
    ]
    assert checkpoint_failures(lines) == 4
    assert checkpoint_failures([{"step": 1}]) == 0
    summary = _summary(tmp_path)
    summary.checkpoint_failures = 4
    _, md_path = write_report(summary, tmp_path)
    assert "| checkpoints that could not be written (docs/reliability.md) | 4 |" in md_path.read_text()
