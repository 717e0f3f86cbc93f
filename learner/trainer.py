"""One optimisation step on a batch of groups, on every FSDP2 rank (no Redis here: see learner/loop.py).

    learner = Learner(cfg.learner, model_path, world, model_dtype="float32", temperature=1.0)
    metrics = learner.train_step(groups)        # every rank passes the same groups; version += 1

The step: the algorithm's advantages (learner/algorithms/) -> this rank's share of sequences, packed into
micro-batches -> per micro-batch log-probs, the algorithm's loss (global token mean over the whole batch on all
ranks) and backward -> clip, AdamW step, warmup schedule -> version + 1. All ranks run the same number of forward/backward passes (FSDP2 collectives must line
up), so a rank with fewer micro-batches runs an empty one with zero weight.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from buffer.records import Group
from learner.algorithms import build_algorithm
from learner.distributed import World, all_reduce
from learner.model import build_optimizer, load_policy
from learner.packing import (
    MicroBatch,
    Sequence,
    pack,
    plan_micro_batches,
    sequences_from_groups,
    split_across_ranks,
    token_logprobs,
)
from learner.settings import LearnerConfig

log = logging.getLogger(__name__)

# per-token statistics summed over loss tokens (then divided by their count), in all-reduce order
_SUM_KEYS = ["pg_loss", "is_weight", "clipped", "masked", "mismatch_kl", "entropy", "kl", "staleness"]
_MAX_KEYS = ["is_weight", "staleness", "ratio"]


class StalenessError(RuntimeError):
    """A batch holds a loss token older than max_staleness versions: admission control was bypassed."""


def batch_staleness(groups: list[Group], version: int) -> np.ndarray:
    """Per loss token: learner version of this step - version that sampled the token."""
    parts = [version - t.sampled_versions() for g in groups for t in g.trajectories]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def check_staleness(groups: list[Group], version: int, max_staleness: int) -> np.ndarray:
    """Per-token staleness of the batch; raise StalenessError if a loss token is older than allowed."""
    for g in groups:
        oldest = g.min_version()
        if oldest is None:
            continue
        if version - oldest > max_staleness:
            raise StalenessError(
                f"batch at version {version} has a token {version - oldest} versions old in group {g.group_id} "
                f"(max_staleness {max_staleness}); the group was released at version {g.release_version}"
            )
    return batch_staleness(groups, version)


def _empty_sequence() -> Sequence:
    """Two tokens, no loss token: keeps a rank with no work in step with the others' collectives."""
    return Sequence(
        token_ids=np.zeros(2, dtype=np.int64),
        prompt_len=1,
        loss_mask=np.zeros(1, dtype=np.uint8),
        behavior_logprobs=np.zeros(1, dtype=np.float32),
        versions=np.full(1, -1, dtype=np.int32),
        advantage=0.0,
    )


class Learner:
    def __init__(
        self,
        cfg: LearnerConfig,
        model_path: str | Path,
        world: World,
        *,
        model_dtype: str = "float32",
        temperature: float = 1.0,
        seed: int = 0,
    ):
        torch.manual_seed(seed)
        self.cfg = cfg
        self.world = world
        self.temperature = temperature
        self.model_path = Path(model_path)
        self.model_dtype = model_dtype
        self.model = load_policy(
            model_path, world, dtype=model_dtype, gradient_checkpointing=cfg.gradient_checkpointing
        )
        self.model.train()
        self.algorithm = build_algorithm(cfg.algorithm, cfg.correction)
        self.reference = (
            load_policy(model_path, world, dtype=model_dtype, trainable=False)
            if self.algorithm.needs_reference
            else None
        )
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg)
        self.version = 0

    # -- the step ---------------------------------------------------------------------------------------------
    def train_step(self, groups: list[Group]) -> dict[str, float]:
        """Train on `groups` (the same list on every rank) at the current version; returns reduced metrics."""
        start = time.perf_counter()
        cfg, world, version = self.cfg, self.world, self.version
        # 1. staleness bound (per loss token) and advantages
        staleness = check_staleness(groups, version, cfg.max_staleness)
        adv = self.algorithm.advantages(groups)
        sequences = sequences_from_groups(groups, adv.advantages)

        # 2. this rank's share, packed; every rank runs the same number of micro-batches
        share = split_across_ranks([len(s) for s in sequences], world.world_size)[world.rank]
        mine = [sequences[i] for i in share]
        plan = plan_micro_batches([len(s) for s in mine], cfg.micro_batch_tokens)
        micro_batches = [pack([mine[i] for i in sorted(b)]) for b in plan]
        n_max = torch.tensor([len(micro_batches)], dtype=torch.int64, device=world.device)
        all_reduce(n_max, world, "max")
        loss_tokens = torch.tensor(
            [sum(float(s.loss_mask.sum()) for s in mine)], dtype=torch.float64, device=world.device
        )
        all_reduce(loss_tokens, world, "sum")
        global_tokens = max(float(loss_tokens.item()), 1.0)
        while len(micro_batches) < int(n_max.item()):
            micro_batches.append(pack([_empty_sequence()]))

        # 3. log-probs, loss, backward (gradient sync only on the last micro-batch)
        # FSDP2 averages gradients over ranks; scaling by world_size makes the result the global token mean.
        scale = world.world_size / global_tokens
        sums = torch.zeros(len(_SUM_KEYS), dtype=torch.float64, device=world.device)
        maxes = torch.full((len(_MAX_KEYS),), -1e30, dtype=torch.float64, device=world.device)
        tokens_local = 0
        for i, mb in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            self.model.set_requires_gradient_sync(last)
            mb = mb.to(world.device)
            loss, stats = self._micro_batch_loss(mb, version)
            (loss * scale).backward()
            tokens_local += mb.num_tokens
            self._accumulate(sums, maxes, stats)

        # 4. optimizer step with clipping and the warmup schedule
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip, foreach=False)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.version += 1

        # 5. metrics, reduced over ranks
        all_reduce(sums, world, "sum")
        all_reduce(maxes, world, "max")
        total_tokens = torch.tensor([tokens_local], dtype=torch.float64, device=world.device)
        all_reduce(total_tokens, world, "sum")
        elapsed = time.perf_counter() - start
        mean = {k: float(v) / global_tokens for k, v in zip(_SUM_KEYS, sums.tolist(), strict=True)}
        peak = dict(zip(_MAX_KEYS, maxes.tolist(), strict=True))
        rewards = np.concatenate([g.rewards for g in groups]) if groups else np.zeros(1)
        return {
            "loss/pg": mean["pg_loss"],
            "loss/entropy": mean["entropy"],
            "loss/kl_ref": mean["kl"],
            "loss/mismatch_kl": mean["mismatch_kl"],
            "loss/clipped_frac": mean["clipped"],
            "loss/masked_frac": mean["masked"],
            "loss/ratio_max": peak["ratio"],
            "is/weight_mean": mean["is_weight"],
            "is/weight_max": peak["is_weight"],
            "loss/grad_norm": float(grad_norm),
            "loss/lr": lr,
            "staleness/mean": float(staleness.mean()) if staleness.size else 0.0,
            "staleness/max": int(staleness.max()) if staleness.size else 0,
            "batch/reward_mean": float(rewards.mean()),
            "batch/zero_adv_groups": adv.zero_adv_groups,
            "batch/groups": len(groups),
            "batch/loss_tokens": int(global_tokens),
            "batch/tool_calls_per_traj": float(
                np.mean([t.info.get("tool_calls", 0) for g in groups for t in g.trajectories])
            )
            if groups
            else 0.0,
            "batch/response_len_mean": float(
                np.mean([len(t.response_ids) for g in groups for t in g.trajectories])
            )
            if groups
            else 0.0,
            "perf/train_s": elapsed,
            "perf/tokens_per_s": float(total_tokens.item()) / elapsed,
            "perf/micro_batches": int(n_max.item()),
            "learner/version": self.version,
        }

    def _micro_batch_loss(self, mb: MicroBatch, version: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logprobs, entropy = token_logprobs(self.model, mb, self.temperature, with_entropy=True)
        keep = mb.keep
        ref_logprobs = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logprobs, _ = token_logprobs(self.reference, mb, self.temperature, with_entropy=False)
        token_versions = mb.versions[keep]
        loss_mask = mb.loss_mask[keep]
        staleness = torch.where(loss_mask > 0, version - token_versions, torch.zeros_like(token_versions))
        if not self.algorithm.needs_entropy:
            entropy = entropy.detach()
        per_token, stats = self.algorithm.loss(
            logprobs,
            mb.behavior_logprobs[keep],
            mb.advantages[keep],
            loss_mask,
            staleness,
            entropy=entropy,
            ref_logprobs=ref_logprobs,
        )
        stats["pg_loss"] = per_token.detach()
        stats["entropy"] = entropy.detach()
        stats["staleness"] = staleness.to(torch.float64)
        stats["loss_mask"] = loss_mask
        return per_token.sum(), stats

    @staticmethod
    def _accumulate(sums: torch.Tensor, maxes: torch.Tensor, stats: dict[str, torch.Tensor]) -> None:
        mask = stats["loss_mask"] > 0
        if not bool(mask.any()):
            return
        for i, key in enumerate(_SUM_KEYS):
            sums[i] += stats[key][mask].double().sum()
        for i, key in enumerate(_MAX_KEYS):
            maxes[i] = torch.maximum(maxes[i], stats[key][mask].double().max())
