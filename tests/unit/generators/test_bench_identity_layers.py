"""bench_generators --identity-layers: the padded model must sample exactly what the original does (the README's
compute-bound figures rest on it), while really having the extra layers."""

from __future__ import annotations

import torch


def _bench_module():
    from scripts.bench import bench_generators

    return bench_generators


def test_identity_layers_leave_the_logits_unchanged(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    padded_dir = _bench_module()._with_identity_layers(tiny_model_dir, 3, tmp_path / "padded")
    original = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    padded = AutoModelForCausalLM.from_pretrained(str(padded_dir), dtype=torch.float32).eval()
    assert padded.config.num_hidden_layers == original.config.num_hidden_layers + 3
    assert sum(p.numel() for p in padded.parameters()) > sum(p.numel() for p in original.parameters())
    ids = torch.randint(0, original.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(padded(ids).logits, original(ids).logits)
