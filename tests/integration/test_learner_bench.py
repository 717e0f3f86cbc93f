"""`scripts/bench_learner.py` on CPU: the trainer's own step (packed), the padded step and the plain PyTorch step run
and report their figures; the Qwen2.5 shape table builds models of the published sizes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_learner  # noqa: E402
from learner_baselines import QWEN_VOCAB, SHAPES  # noqa: E402


@pytest.mark.timeout(600)
def test_quick_cpu_run_reports_packed_padded_and_plain(capsys):
    argv = ["--quick", "--json", "--reference", "--steps", "1", "--groups", "2", "--group-size", "4"]
    assert bench_learner.main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["device"] == "cpu" and result["attention"] == "sr1_varlen_sdpa"
    for mode in ("packed", "padded", "plain"):
        assert result[f"{mode}/tokens_per_s"] > 0
        assert f"{mode}/mfu" not in result  # no peak FLOP/s is known for a CPU unless given
    assert result["ratio_packed_over_padded"] > 0 and result["ratio_packed_over_plain"] > 0
    assert 0 < result["padded/pad_fraction"] < 1 and result["torch"]


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
