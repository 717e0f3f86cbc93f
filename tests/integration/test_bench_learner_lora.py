"""`scripts/bench/bench_learner_lora.py` (`bench_learner.py --lora`): both modes run in their own processes on the
same model, the LoRA mode trains only its adapters, and the ratios are those of the figures it prints; `--plain`
does the same without sr1's learner. Figures are asserted only where they are exact (counts), never timings."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("plain", [False, True], ids=["learner", "plain"])
def test_both_modes_run_on_one_model_and_lora_trains_only_its_adapters(tiny_model_dir, plain):
    from scripts.bench import bench_learner_lora as bench

    argv = ["--model", str(tiny_model_dir), "--steps", "1", "--rank", "4", "--threads", "1"]
    result = bench.run(bench.parse(argv + (["--plain"] if plain else [])))
    full, lora = result["full"], result["lora"]
    assert full["state/trained_parameters"] > 10 * lora["state/trained_parameters"] > 0
    # fp32 gradients of the adapters only; --plain has no optimizer
    assert lora["state/gradients"] == 4 * lora["state/trained_parameters"]
    assert (full["state/optimizer"] > 0) != plain and (lora["state/optimizer"] > 0) != plain
    assert result["ratio_tokens_per_s"] == pytest.approx(lora["tokens_per_s"] / full["tokens_per_s"])
    assert result["ratio_peak_rss"] == pytest.approx(lora["peak_rss"] / full["peak_rss"])
    assert all(r["tokens_per_s"] > 0 and r["peak_rss"] >= 0 for r in (full, lora))


def test_a_model_directory_without_a_config_is_refused(tmp_path):
    from scripts.bench import bench_learner_lora as bench

    with pytest.raises(SystemExit, match="no config.json"):
        bench.run(bench.parse(["--model", str(tmp_path), "--steps", "1"]))
