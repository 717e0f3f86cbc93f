"""Any number of learner ranks for any batch: 7 groups on 3, 5 or 6 gloo ranks give one rank's update.

The batch's trajectories are dealt to the ranks by tokens (learner/minibatches.py), so 7 groups of 3 leave the ranks
uneven shares (and, on 6 ranks, a mini-batch one rank has no trajectory of); the loss is the whole step's token mean
however it was split. Each case trains one step from the same weights on the same batch with 1 and with N ranks
and compares the weights after the step and every reduced metric. Cases: GRPO with the KL to a reference in the loss,
cut into three PPO mini-batches (8 + 8 + 5 trajectories: three optimizer updates); PPO with its critic and whitened
advantages over two mini-batches.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

GROUPS, GROUP_SIZE = 7, 3
LR = 1e-3
CASES = {
    "grpo": {"ppo_mini_batch_size": 8, "algorithm": {"type": "grpo", "kl_coef": 0.01}},
    "ppo": {"ppo_mini_batch_size": 12, "algorithm": {"type": "ppo", "whiten_advantages": True}},
}


def _rank_main(rank: int, world_size: int, port: int, model_dir: str, out: str, case: str) -> None:
    from fakes.groups import random_groups
    from learner.model import full_tensor
    from learner.settings import LearnerConfig
    from learner.trainer import Learner
    from tests.fakes.gloo import gloo_rank

    with gloo_rank(rank, world_size, port) as world:
        cfg = LearnerConfig(
            groups_per_step=GROUPS,
            num_ranks=world_size,
            lr=LR,
            micro_batch_tokens=64,
            max_staleness=1,
            correction="tis",
            **CASES[case],
        )
        learner = Learner(cfg, model_dir, world, seed=0)

        def weights() -> dict[str, np.ndarray]:  # every rank joins each gather
            return {
                name: full_tensor(tensor.detach()).double().cpu().numpy()
                for name, tensor in learner.model.state_dict().items()
            }

        before = weights()
        groups = random_groups(np.random.default_rng(0), n_groups=GROUPS, group_size=GROUP_SIZE, version=0)
        metrics = learner.train_step(groups)
        update = {name: after - before[name] for name, after in weights().items()}
        if rank == 0:
            np.savez(out + ".npz", **update)
            Path(out + ".json").write_text(json.dumps(metrics))


def _run(world_size: int, port: int, model_dir: Path, out: Path, case: str) -> tuple[dict, dict]:
    from tests.fakes.gloo import run_ranks

    run_ranks(_rank_main, world_size, port, str(model_dir), str(out), case)
    with np.load(str(out) + ".npz") as saved:
        weights = {name: saved[name] for name in saved.files}
    return weights, json.loads(Path(str(out) + ".json").read_text())


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir, tmp_path_factory):
    """One rank's step on each case, trained once for the module."""
    from sr1.launch.supervisor import free_port

    out = tmp_path_factory.mktemp("one_rank")
    return {case: _run(1, free_port(), tiny_model_dir, out / case, case) for case in CASES}


def _check_same_update(one: tuple[dict, dict], many: tuple[dict, dict], ranks: int) -> None:
    """The metrics and the weights' update (after - before the step) of N ranks against one rank's."""
    (w_one, m_one), (w_many, m_many) = one, many
    assert m_many["batch/groups"] == GROUPS
    compared = [k for k in m_one if not k.startswith("perf/")]
    assert set(compared) <= set(m_many)
    for key in compared:
        assert m_many[key] == pytest.approx(m_one[key], rel=1e-4, abs=1e-6), (
            f"{ranks} ranks, {key}: {m_many[key]} vs one rank's {m_one[key]}"
        )
    # the step moved the weights the same way. Adam's first updates are about lr per element whatever the gradient's
    # scale (the metrics above catch a wrong scale: loss/grad_norm), so a wrong share shows as elements moved
    # differently; an element whose gradient is within rounding of zero may legitimately move differently too (a
    # handful of ~400k), the update as a whole may not
    moved = total = 0.0
    off = size = 0
    for name, update_one in w_one.items():
        difference = w_many[name] - update_one
        moved += float(np.square(update_one).sum())
        total += float(np.square(difference).sum())
        off += int((np.abs(difference) > 0.1 * LR).sum())
        size += difference.size
    assert moved > 0
    assert off <= 1e-4 * size, f"{ranks} ranks: {off} of {size} weights moved differently from one rank's"
    relative = np.sqrt(total / moved)
    assert relative < 1e-2, (
        f"{ranks} ranks: the update differs from one rank's by {relative:.2e} (relative norm)"
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "case", [c if c == "grpo" else pytest.param(c, marks=pytest.mark.long) for c in sorted(CASES)]
)
def test_three_ranks_on_seven_groups_match_one_rank(case, one_rank, tiny_model_dir, tmp_path, free_port):
    many = _run(3, free_port, tiny_model_dir, tmp_path / case, case)
    _check_same_update(one_rank[case], many, 3)


@pytest.mark.slow
@pytest.mark.long  # five and six gloo ranks on two cores: minutes; three ranks on GRPO stay in `make test`
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("ranks", "case"), [(5, "ppo"), (6, "grpo")])
def test_five_and_six_ranks_on_seven_groups_match_one_rank(
    ranks, case, one_rank, tiny_model_dir, tmp_path, free_port
):
    """6 ranks on GRPO's last mini-batch of 5 trajectories: one rank has none and runs an empty micro-batch."""
    many = _run(ranks, free_port, tiny_model_dir, tmp_path / case, case)
    _check_same_update(one_rank[case], many, ranks)
