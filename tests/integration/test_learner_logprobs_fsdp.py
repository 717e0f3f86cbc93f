"""The chunked log-prob head over 2 gloo FSDP2 ranks: log-probs, entropies and the reduce-scattered gradients of
every parameter equal those of full logits, with the LM head tied to the embeddings (the head's weight is used
outside the model's forward, and its gradient joins the embedding's). The untied tiny model takes the same path in
test_learner_fsdp.py (2 ranks = 1 rank) and tests/unit/learner/test_learner_packing.py (= full logits)."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # several processes, or many steps: `make test-fast` leaves it out


def _rank_main(rank: int, world_size: int, port: int, model_dir: str) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    import torch

    torch.set_num_threads(1)
    from buffer.records import Group
    from fakes.groups import random_groups
    from learner.distributed import init_distributed, shutdown_distributed
    from learner.model import load_policy
    from learner.packing import pack, sequences_from_groups, token_logprobs
    from tests.unit.learner.test_learner_packing import full_logits_logprobs

    world = init_distributed("cpu")
    # each rank its own micro-batches: the gradients differ per rank until FSDP2 reduces them
    groups: list[Group] = random_groups(np.random.default_rng(rank), n_groups=2, group_size=2, vocab_size=500)
    batches = [pack(sequences_from_groups([g], [np.array([1.0, -0.5])])) for g in groups]
    results = {}
    for path in ("chunked", "full"):
        model = load_policy(model_dir, world)
        for i, mb in enumerate(batches):
            model.set_requires_gradient_sync(i == len(batches) - 1)
            if path == "chunked":
                logprobs, entropy = token_logprobs(model, mb, 0.7, with_entropy=True, chunk_tokens=5)
            else:
                logprobs, entropy = full_logits_logprobs(model, mb, 0.7)
            (logprobs * torch.linspace(-1, 1, len(logprobs)) + 0.1 * entropy).sum().backward()
        grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
        results[path] = (logprobs.detach(), entropy.detach(), grads)
    (lp_a, ent_a, grads_a), (lp_b, ent_b, grads_b) = results["chunked"], results["full"]
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_a, ent_b, atol=1e-5, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-5, msg=name)
    shutdown_distributed()


@pytest.mark.timeout(300)
def test_two_ranks_chunked_head_equals_full_logits_tied(tiny_model_dir, tmp_path, free_port):
    import torch.multiprocessing as mp

    from tests.unit.learner.test_learner_packing import tied_copy

    model_dir = tied_copy(tiny_model_dir, tmp_path / "tied")
    mp.spawn(
        _rank_main, args=(2, free_port, str(model_dir)), nprocs=2, join=True
    )  # a failed assert raises here
