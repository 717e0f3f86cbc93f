"""The step's optimizer updates: the batch cut into PPO mini-batches, each split over the ranks and packed.

    plan = plan_updates(sequences, mini_batch_size=256, budget=8192, world=world)
    for mini in plan:                       # the same number on every rank, in the same order
        for part in mini.micro_batches:     # equal counts on every rank (a rank short of work runs empty ones)
            ...part.mb, part.sequences (indices into `sequences`), part.ref_logprobs, part.old_values...

`learner.ppo_mini_batch_size` counts trajectories (Search-R1's fork of verl cuts its batch rows the same way): the
batch's trajectories, in group order, are cut into consecutive mini-batches of that size, and each is one optimizer
update; `learner.ppo_epochs` goes over all of them that many times. Every rank holds the same list of sequences, so
every rank plans the same mini-batches; each mini-batch's sequences are balanced over the ranks by tokens
(`split_across_ranks`) and packed under `micro_batch_tokens`. One mini-batch and one epoch is the plain step (the
whole batch, one update).

Any number of ranks takes any batch (7 groups on 3 ranks, Search-R1's 512 on 6 or 7): the ranks are dealt single
trajectories, not whole groups, because nothing a rank computes needs a whole group beside it. Every rank receives the
whole batch, so the group statistics (GRPO's mean and std, RLOO's leave-one-out mean, REINFORCE's group baseline) come
from every group's scores on every rank (`AdvantageBatch.scores`), and what spans ranks (the KL in the reward, the
batch-wide whitening of REINFORCE++ and PPO, the critic's fit, the metrics) is summed over them. A rank's time is its
tokens, and a trajectory is the finer unit to balance them with (a group of 5 long answers is one indivisible lump);
a mini-batch need not hold whole groups either (256 trajectories of groups of 5). The loss is the token mean over the
whole mini-batch on all ranks (`MiniBatch.loss_tokens`, reduced over them) and FSDP2 averages the ranks' gradients, so
the update is the one a single rank makes on the same batch, whatever the split (tests/integration/
test_learner_uneven_ranks.py); a rank short of trajectories runs empty micro-batches so that every rank makes the same
collectives.

What a step computes before its first update (no gradient, the weights of the step's start) is kept beside each
packed micro-batch, aligned with its `keep` positions: the reference's log-probs (the KL), the policy's own
(the proximal policy of the correction when the step makes several updates, and the KL in the reward) and the
critic's values; after the advantages, the critic's returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from learner.distributed import World, all_reduce
from learner.packing import MicroBatch, Sequence, pack, plan_micro_batches, split_across_ranks


def empty_sequence() -> Sequence:
    """Two tokens, no loss token: keeps a rank with no work in step with the others' collectives."""
    return Sequence(
        token_ids=np.zeros(2, dtype=np.int64),
        prompt_len=1,
        loss_mask=np.zeros(1, dtype=np.uint8),
        behavior_logprobs=np.zeros(1, dtype=np.float32),
        versions=np.full(1, -1, dtype=np.int32),
        advantage=0.0,
    )


@dataclass
class PackedPart:
    """One packed micro-batch of this rank and what the step computed for it before its first update."""

    mb: MicroBatch
    sequences: list[int]  # indices into the step's sequences, in packing order (empty: a padding micro-batch)
    ref_logprobs: torch.Tensor | None = None  # keep-aligned
    proximal_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None

    def split(self, keep_aligned: torch.Tensor, sequences: list[Sequence]) -> list[np.ndarray]:
        """A keep-aligned tensor cut into one response-aligned array per packed sequence."""
        sizes = [len(sequences[i]) - sequences[i].prompt_len for i in self.sequences]
        return (
            [part.double().cpu().numpy() for part in torch.split(keep_aligned.detach(), sizes)]
            if sizes
            else []
        )


@dataclass
class MiniBatch:
    micro_batches: list[PackedPart] = field(default_factory=list)
    loss_tokens: float = 1.0  # loss tokens of the mini-batch over every rank (at least 1)


def mini_batch_slices(count: int, size: int | None) -> list[range]:
    """Consecutive index ranges of `size` trajectories (the last one may be shorter); one range without a size."""
    if not size or size >= count:
        return [range(count)]
    return [range(start, min(start + size, count)) for start in range(0, count, size)]


def plan_updates(
    sequences: list[Sequence], *, mini_batch_size: int | None, budget: int, world: World
) -> list[MiniBatch]:
    """This rank's packed micro-batches, per mini-batch, with equal micro-batch counts on every rank."""
    minis: list[MiniBatch] = []
    for indices in mini_batch_slices(len(sequences), mini_batch_size):
        chosen = list(indices)
        share = split_across_ranks([len(sequences[i]) for i in chosen], world.world_size)[world.rank]
        mine = [chosen[i] for i in share]
        plan = plan_micro_batches([len(sequences[i]) for i in mine], budget)
        parts = []
        for b in plan:
            members = [mine[i] for i in sorted(b)]
            parts.append(PackedPart(pack([sequences[i] for i in members]), members))
        minis.append(MiniBatch(parts, float(sum(float(sequences[i].loss_mask.sum()) for i in mine))))
    counts = torch.tensor([len(m.micro_batches) for m in minis], dtype=torch.int64, device=world.device)
    tokens = torch.tensor([m.loss_tokens for m in minis], dtype=torch.float64, device=world.device)
    all_reduce(counts, world, "max")
    all_reduce(tokens, world, "sum")
    for mini, count, total in zip(minis, counts.tolist(), tokens.tolist(), strict=True):
        while len(mini.micro_batches) < count:
            mini.micro_batches.append(PackedPart(pack([empty_sequence()]), []))
        mini.loss_tokens = max(float(total), 1.0)
    return minis
