"""`scripts/bench/bench_learner.py` on CPU: the trainer's own step (packed), the padded step and the plain PyTorch step run
and report their figures on the toy mix and on Search-R1's workload (scaled down); the prepared GPU call runs its
stages on CPU (`DRY=1 scripts/gpu_check.sh`, in CI, so the GPU run cannot fail on something trivial); the Qwen2.5
shape table builds models of the published sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import scripts.bench.bench_learner as bench_learner
from scripts.bench.learner_baselines import QWEN_VOCAB, SHAPES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_quick_cpu_run_reports_packed_padded_and_plain(capsys):
    argv = ["--quick", "--json", "--reference", "--steps", "1", "--groups", "2", "--group-size", "4"]
    assert bench_learner.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["device"] == "cpu" and result["attention"] == "sr1_varlen_sdpa"
    assert result["workload"] == "tiny" and result["workload_detail"].startswith("tiny (toy mix")
    for mode in ("packed", "padded", "plain"):
        assert result[f"{mode}/tokens_per_s"] > 0
        assert f"{mode}/mfu" not in result  # no peak FLOP/s is known for a CPU unless given
    assert result["ratio_packed_over_padded"] > 0 and result["ratio_packed_over_plain"] > 0
    assert 0 < result["padded/pad_fraction"] < 1 and result["torch"]
    assert result["reference_forward"] is False and result["updates_per_step"] == 1


@pytest.mark.timeout(600)
def test_the_search_r1_step_on_cpu_trains_mini_batches_with_the_reference_forward(capsys):
    """sr1's 8xH100 preset, lengths x 0.05: two updates of four trajectories per step, the reference and the
    proximal forward before them (tis recomputes the proximal policy when a step makes several updates), and the
    plain step with the same forwards; MFU with and without the no-gradient forwards."""
    argv = [
        "--workload",
        "search-r1",
        "--length-scale",
        "0.05",
        "--trajectories",
        "4",
        "--warmup-trajectories",
        "1",
    ]
    argv += ["--budget", "1024", "--plain", "--peak-flops", "1e12", "--json"]
    assert bench_learner.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["workload"] == "search-r1" and result["preset"] == "qwen2.5-3b-8xh100"
    assert (
        "profile qwen2.5-3b-h100" in result["workload_detail"]
        and "lengths x 0.05" in result["workload_detail"]
    )
    assert (
        result["updates_per_step"] == 2
        and result["trajectories_per_update"] == 4
        and result["trajectories"] == 8
    )
    assert result["reference_forward"] and result["proximal_forward"] and result["kl_coef"] == 0.001
    assert result["gradient_checkpointing"] == "full" and result["dtype"] == "float32"  # the preset's, on CPU
    assert 0 < result["loss_token_fraction"] < 1  # observation and prompt tokens carry no loss
    for mode in ("packed", "plain"):
        mfu = result[f"{mode}/mfu"]
        assert mfu > 0 and result[f"{mode}/mfu_all_passes"] == pytest.approx(mfu * (6 + 2 + 2) / 6)
    assert result["packed/estimate_gib"] > 0 and "padded/tokens_per_s" not in result
    assert result["plain/shape"].endswith("per update")


@pytest.mark.slow
@pytest.mark.long  # three minutes on a 2-core Xeon: `make test-long`; its stages' unit tests run in `make test`
@pytest.mark.timeout(600)
def test_the_gpu_check_runs_every_stage_on_cpu_when_dry(tmp_path):
    """DRY=1: the prepared GPU call's stages, flags and code paths on the CPU with the small model, the modules the
    GPU image lacks unimportable; every stage passes and writes its JSON line, and the table closes the run."""
    env = os.environ | {"DRY": "1", "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "stages.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows] == [
        "0-env", "1-3b", "2-3b-lora", "3-1.5b", "4-0.5b", "5-3b-none", "6-3b-selective", "7-0.5b-chunked",
        "8-gpu-tier", "9-3b-6-ranks", "10-3b-offload",
    ]  # fmt: skip
    assert all(r["status"] == "ok" and r["dry"] for r in rows), [(r["stage"], r.get("error")) for r in rows]
    env_row, tier = rows[0], rows[8]
    assert env_row["python"] and env_row["plans"]["qwen2.5-3b/6"]["checkpointing"] == "none"  # CPU's auto
    for row in (env_row, tier):  # no GPU here: every GPU test is collected and skipped
        assert row["tests/tests"] > 0 and row["tests/skipped"] == row["tests/tests"]
    benches = {r["stage"]: r for r in rows if r["stage"] not in ("0-env", "8-gpu-tier")}
    for row in benches.values():
        assert row["workload"] == "search-r1" and row["tokens_per_s"] > 0 and row["estimate_gib"] > 0
        assert row["graphs"] == 0 and row["execution"]  # CPU: eager layers
    ckpt = [benches[k]["checkpointing"] for k in ("1-3b", "2-3b-lora", "5-3b-none", "6-3b-selective")]
    assert ckpt == ["full", "none", "none", "selective"]  # 2-3b-lora: the learner's auto, none on CPU
    assert benches["1-3b"]["x_plain"] > 0 and benches["6-3b-selective"]["x_plain"] is None
    lora, full = benches["2-3b-lora"], benches["1-3b"]
    assert lora["lora"]["rank"] == 16 and len(lora["lora"]["target_modules"]) == 7 and full["lora"] is None
    assert 0 < lora["trained_parameters"] < full["trained_parameters"] / 10 and lora["x_plain"] is None
    assert [benches[k]["logprob_head"] for k in ("4-0.5b", "7-0.5b-chunked")] == ["chunked", "chunked"]  # CPU
    assert "what a learner of 6 ranks picks" in benches["9-3b-6-ranks"]["checkpointing_why"]
    profile = json.loads((tmp_path / "1-3b.json").read_text())["profile/top"]
    assert profile and profile[0]["calls"] > 0
    assert "stage" in proc.stdout and "10-3b-offload" in (tmp_path / "table.txt").read_text()


@pytest.mark.parametrize(
    ("shape", "billions"), [("qwen2.5-0.5b", 0.494), ("qwen2.5-1.5b", 1.544), ("qwen2.5-3b", 3.086)]
)
def test_shapes_have_the_published_parameter_counts(shape, billions):
    """Qwen2.5's model cards: 0.49B, 1.54B and 3.09B parameters (tied embeddings counted once)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=QWEN_VOCAB, tie_word_embeddings=True, **SHAPES[shape])
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.001)
