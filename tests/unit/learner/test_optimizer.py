"""The optimizer step: fused AdamW over FSDP2's DTensor shards takes the per-parameter loop's step; a non-finite
gradient norm skips the update."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from learner.model import build_optimizer, clip_and_step, load_policy

SETTINGS = SimpleNamespace(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01, warmup_steps=0)


def fake_gradients(model: torch.nn.Module, seed: int) -> None:
    """Seeded random gradients, the same global values on any world size (sharded like each parameter)."""
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator).to(p.device, p.dtype)
        if hasattr(p, "full_tensor"):  # an FSDP2 shard: the same values, distributed like the parameter
            from torch.distributed.tensor import distribute_tensor

            p.grad = distribute_tensor(p.grad, p.device_mesh, p.placements)


def test_fused_adamw_on_dtensor_shards_matches_the_per_parameter_loop(world, tiny_model_dir):
    weights = []
    for fused in (True, False):
        model = load_policy(tiny_model_dir, world)
        optimizer, _ = build_optimizer(model, SETTINGS)
        assert optimizer.defaults["fused"] is True
        if not fused:  # the optimizer the learner used before: foreach=False, one small kernel at a time
            optimizer = torch.optim.AdamW(
                model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01, foreach=False
            )
        for step in range(3):
            fake_gradients(model, step)
            grad_norm, skipped = clip_and_step(model, optimizer, max_norm=1.0)
            assert not skipped and grad_norm.ndim == 0 and float(grad_norm) > 1.0
        weights.append({k: v.full_tensor().clone() for k, v in model.state_dict().items()})
    for name, tensor in weights[0].items():
        torch.testing.assert_close(tensor, weights[1][name], atol=1e-6, rtol=1e-5, msg=name)


def test_a_nonfinite_gradient_norm_skips_the_update():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer, _ = build_optimizer(model, SETTINGS)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(2, 4)).sum().backward()
    model.bias.grad[1] = float("inf")
    grad_norm, skipped = clip_and_step(model, optimizer, max_norm=1.0)
    assert skipped and not torch.isfinite(grad_norm)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters()) and not optimizer.state

    model(
        torch.randn(2, 4)
    ).sum().backward()  # a finite loss flagged non-finite elsewhere (another rank) skips too
    _, skipped = clip_and_step(model, optimizer, max_norm=1.0, loss_nonfinite=torch.tensor(True))
    assert skipped and not optimizer.state

    model(torch.randn(2, 4)).sum().backward()
    _, skipped = clip_and_step(model, optimizer, max_norm=1.0, loss_nonfinite=torch.tensor(False))
    assert not skipped and not torch.equal(model.weight, before[0])
