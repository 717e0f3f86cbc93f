"""The pause each weight update cost the engines and the probe check, in the live table and report.md."""

from __future__ import annotations

from sr1.live import engine_updates
from sr1.report import RunSummary, engine_update_figures, write_report

FULL = {
    "rollout/updates_loaded": 4,
    "rollout/update_pause_s_p50": 0.2,
    "rollout/update_pause_s_p95": 0.5,
    "rollout/update_pause_s_max": 0.6,
    "rollout/adapter_probe_diff": 0.001,
    "rollout/adapter_mismatches": 0,
}
LORA = {**FULL, **{k: 0.0 for k in FULL if "pause" in k}}


def test_the_live_table_shows_the_pause_and_a_mismatch_loudly():
    assert engine_updates([{"rollout/tokens_per_s": 3.0}]) is None  # before any update
    assert engine_updates([LORA, LORA]) == "pause 0.000s median, 0.000s max; probe 0.0010"
    broken = {**LORA, "rollout/adapter_mismatches": 1, "rollout/adapter_probe_diff": 0.3}
    assert (
        engine_updates([LORA, broken])
        == "ADAPTER MISMATCH (1); pause 0.000s median, 0.000s max; probe 0.3000"
    )


def test_the_report_shows_the_pause_per_update_and_the_mismatches(tmp_path):
    figures = engine_update_figures([FULL, {**FULL, "rollout/adapter_mismatches": 2}])
    assert figures == {
        "updates_loaded": 8,
        "pause_s_p50": 0.2,
        "pause_s_p95": 0.5,
        "pause_s_max": 0.6,
        "probe_diff": 0.001,
        "adapter_mismatches": 2,
    }
    summary = RunSummary(
        run_dir=str(tmp_path), preset="tiny-lora", seed=0, max_staleness=2, correction="tis", algorithm="grpo",
        steps=4, wall_s=10.0, em_before=0.1, em_after=0.3, engine_updates=figures,
    )  # fmt: skip
    _, md = write_report(summary, tmp_path)
    text = md.read_text()
    assert (
        "| decoding paused per update: median / p95 / max (worst engine) | 0.200 / 0.500 / 0.600 s |" in text
    )
    assert "(AdapterMismatch) | 2 (see logs/gen-*.log) |" in text
    summary.engine_updates = {}
    assert "| engine weight updates | none loaded |" in write_report(summary, tmp_path)[1].read_text()
