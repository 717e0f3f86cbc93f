"""One optimisation step on a batch of groups, on every FSDP2 rank (no Redis here: see learner/loop.py).

    learner = Learner(cfg.learner, model_path, world, model_dtype="float32", temperature=1.0)
    metrics = learner.train_step(groups)        # every rank passes the same groups; version += 1

The step: DAPO's reward shaping (learner/algorithms/shaping.py) -> the batch cut into PPO mini-batches, this rank's
share of each packed into micro-batches (learner/minibatches.py) -> before any update, at the step's starting
weights: the reference's and the policy's log-probs and the critic's values where the algorithm needs them -> the
algorithm's advantages (learner/algorithms/) -> `ppo_epochs` times over the mini-batches: per micro-batch log-probs,
the algorithm's loss (global token mean over the mini-batch on all ranks) and backward, then clip and one AdamW step
(the critic's value loss and step beside, learner/critic.py; an update whose loss or gradient norm is not finite is
skipped with its gradients cleared: `loss/nonfinite_skipped`) -> warmup schedules, the KL controller -> version + 1.
The version counts batches, not optimizer updates: one publish per batch. All ranks run the same number of
forward/backward passes (FSDP2 collectives must line up), so a rank with fewer micro-batches runs an empty one with
zero weight. The statistics each micro-batch adds, their reduction over ranks and the metrics the step returns are
learner/step_metrics.py's.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from buffer.records import Group
from buffer.staleness import StepBounds, check_staleness, largest_bound
from learner.algorithms import AdvantageBatch, TokenAdvantages, TrajectoryTokens, build_algorithm, kl_estimate
from learner.algorithms.corrections import offpolicy_stats
from learner.algorithms.shaping import shaped_rewards, truncated
from learner.critic import Critic
from learner.distributed import World, all_reduce
from learner.execution.device import synchronisation_check
from learner.execution.plan import plan_execution
from learner.lora import adapter_config, adapter_weights, adapters_disabled
from learner.minibatches import MiniBatch, PackedPart, plan_updates
from learner.model import build_optimizer, clip_and_step, load_policy, named_weights, reshard
from learner.packing import MicroBatch, Sequence, sequences_from_groups, token_logprobs
from learner.probe import ProbeSource
from learner.settings import LearnerConfig
from learner.step_metrics import StepTotals, critic_metrics, step_metrics

log = logging.getLogger(__name__)


def _count_batch(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """Step a warmup schedule once per batch, also after a batch whose update was skipped (a non-finite loss or
    gradient norm: torch then warns that the scheduler stepped before the optimizer, which is meant here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))
        scheduler.step()


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
        max_response_tokens: int | None = None,
        attention: str | None = None,
    ):
        """`attention`: how packed sequences are kept apart (learner/execution/attention.py); None or auto follows
        learner.attention, the benchmark and the GPU tests name one to compare them. How the step runs on this device
        (attention, compiled layers, log-prob head, checkpointing, FSDP2 settings) is decided once, before any model
        loads, and logged (learner/execution/plan.py); a micro-batch budget that cannot fit the GPU fails there."""
        torch.manual_seed(seed)
        self.cfg = cfg
        self.world = world
        self.temperature = temperature
        self.max_response_tokens = (
            max_response_tokens  # the generators' token budget (DAPO's overlong shaping)
        )
        self.model_path = Path(model_path)
        self.model_dtype = model_dtype
        self.algorithm = build_algorithm(cfg.algorithm, cfg.correction)
        self.execution = plan_execution(
            cfg,
            model_path,
            world,
            model_dtype,
            reference=self.algorithm.needs_reference and cfg.lora is None,
            critic=self.algorithm.needs_values,
            attention=attention,
        )
        # a torch.cuda sync debug mode ("warn"/"error") for the micro-batch loops: the GPU tier's check
        self.sync_check: str | None = None
        self.head_options = {"chunk_tokens": cfg.logprob_chunk_tokens, "head": self.execution.logprob_head}
        options = self.execution.load_options()
        self.model = load_policy(
            model_path, world, dtype=model_dtype, cpu_offload=cfg.cpu_offload, lora=cfg.lora, **options
        )
        self.model.train()
        # the KL reference: with LoRA the same model with its adapters off (learner/lora.py), else a frozen copy
        self.reference = (
            load_policy(
                model_path,
                world,
                dtype=model_dtype,
                trainable=False,
                cpu_offload=cfg.cpu_offload,
                **options,
            )
            if self.algorithm.needs_reference and cfg.lora is None
            else None
        )
        self.probe = ProbeSource(self.model, self.head_options)
        self.critic = (
            Critic(
                cfg.algorithm.critic,
                model_path,
                world,
                betas=cfg.betas,
                dtype=model_dtype,
                cpu_offload=cfg.cpu_offload,
                **options,
            )
            if self.algorithm.needs_values
            else None
        )
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg)
        self.version = 0

    # -- the step ---------------------------------------------------------------------------------------------
    def train_step(self, groups: list[Group], bounds: StepBounds | None = None) -> dict[str, float]:
        """Train on `groups` (the same list on every rank) at the current version; returns reduced metrics. `bounds`:
        the staleness bounds to assert (default: learner.max_staleness, or auto's ceiling)."""
        start = time.perf_counter()
        cfg, world, version, algorithm = self.cfg, self.world, self.version, self.algorithm
        # 1. staleness bound (per loss token); DAPO's reward shaping and overlong filtering
        bounds = bounds if bounds is not None else StepBounds(largest_bound(cfg.max_staleness))
        staleness = check_staleness(groups, version, bounds)
        rewards = shaped_rewards(groups, algorithm.cfg.overlong, self.max_response_tokens)
        sequences, owners = self._sequences(groups)
        self.probe.take(sequences)  # the tokens whose log-probs go with the next publish (learner/probe.py)

        # 2. the updates: mini-batches, each split over the ranks and packed (equal counts on every rank)
        updates = plan_updates(
            sequences, mini_batch_size=cfg.ppo_mini_batch_size, budget=cfg.micro_batch_tokens, world=world
        )
        # 3. before the first update, at the step's starting weights: reference/proximal log-probs, old values
        self._before_updates(updates, several_updates=len(updates) * cfg.ppo_epochs > 1)
        # 4. advantages (and the critic's returns) of this rank's trajectories, into their micro-batches
        adv = self._advantages(groups, rewards, sequences, owners, updates)

        # 5. ppo_epochs x mini-batches: log-probs, loss, backward, clip, AdamW (the critic's update beside)
        # a critic's warm-up is a setting of the algorithms that have one (none: no warm-up, as config/schema reads it)
        train_policy = self.critic is None or version >= getattr(algorithm.cfg, "critic_warmup", 0)
        totals = StepTotals.zeros(world.device)
        for epoch in range(cfg.ppo_epochs):
            for i, mini in enumerate(updates):  # the first update runs at the step's starting weights
                self._update(mini, version, totals, train_policy, at_start=epoch == 0 and i == 0)
        if self.execution.keep_unsharded:
            reshard(self.model)  # a policy that only ran forward (the critic's warmup) still holds its gather

        # 6. warmup schedules (the policy's waits through the critic's warmup), the KL controller, version + 1
        lr = self.scheduler.get_last_lr()[0]
        if train_policy:
            _count_batch(self.scheduler)
        critic_lr = None
        if self.critic is not None:
            critic_lr = self.critic.scheduler.get_last_lr()[0]
            _count_batch(self.critic.scheduler)
        self.version += 1

        # 7. metrics, reduced over ranks
        reduced = totals.reduce(world)
        if algorithm.needs_reference and train_policy:
            algorithm.kl_controller.update(reduced.mean["kl"], sum(len(g.trajectories) for g in groups))
        metrics = step_metrics(
            reduced,
            totals,
            lr=lr,
            kl_coef=algorithm.kl_controller.value,
            staleness=staleness,
            bounds=bounds,
            groups=groups,
            rewards=rewards,
            zero_adv_groups=adv.zero_adv_groups,
            updates=updates,
            ppo_epochs=cfg.ppo_epochs,
            elapsed=time.perf_counter() - start,
            version=self.version,
        )
        if self.critic is not None:
            metrics |= critic_metrics(totals, critic_lr, updates, reduced.denominator, self._sum_over_ranks)
        return metrics

    # -- the parts of the step --------------------------------------------------------------------------------
    def _sequences(self, groups: list[Group]) -> tuple[list[Sequence], list[tuple[int, int]]]:
        """Every trajectory as a packed sequence (advantages come later), and its (group, sample) owner; DAPO's
        overlong filtering takes truncated trajectories out of the loss."""
        sequences = sequences_from_groups(groups, [np.zeros(len(g.trajectories)) for g in groups])
        owners = [(g, j) for g, group in enumerate(groups) for j in range(len(group.trajectories))]
        if self.algorithm.cfg.overlong.mask_truncated:
            flat = [t for g in groups for t in g.trajectories]
            sequences = [
                dataclasses.replace(s, loss_mask=np.zeros_like(s.loss_mask)) if truncated(t) else s
                for s, t in zip(sequences, flat, strict=True)
            ]
        return sequences, owners

    def _needs_policy_pass(self, several_updates: bool) -> bool:
        """The policy's own log-probs at the step's start: the KL in the reward, or the proximal policy of a
        correction when later updates move the weights away from it."""
        cfg, correction = self.algorithm.cfg, self.algorithm.correction
        proximal = correction.recomputes_proximal
        return cfg.kl_in_reward or (several_updates and proximal)

    def _before_updates(self, updates: list[MiniBatch], several_updates: bool) -> None:
        """No-gradient forward passes at the step's starting weights, kept beside each packed micro-batch."""
        policy_pass = self._needs_policy_pass(several_updates)
        reference = self.algorithm.needs_reference
        if not reference and self.critic is None and not policy_pass:
            return
        with torch.no_grad(), synchronisation_check(self.sync_check, self.world.device):
            for mini in updates:
                for part in mini.micro_batches:
                    mb = part.mb.to(self.world.device)
                    if reference:
                        part.ref_logprobs = self._reference_logprobs(mb)
                    if policy_pass:
                        part.proximal_logprobs, _ = token_logprobs(
                            self.model, mb, self.temperature, with_entropy=False, **self.head_options
                        )
                    if self.critic is not None:
                        part.old_values = self.critic.values(mb)
        if self.reference is not None and self.execution.keep_unsharded:
            reshard(self.reference)  # kept gathered across its micro-batches only

    def _reference_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        """The KL reference's log-probs: the frozen copy, or with LoRA the policy with its adapters off."""
        if self.reference is not None:
            return token_logprobs(
                self.reference, mb, self.temperature, with_entropy=False, **self.head_options
            )[0]
        with adapters_disabled(self.model):
            return token_logprobs(self.model, mb, self.temperature, with_entropy=False, **self.head_options)[
                0
            ]

    def _sum_over_ranks(self, values: np.ndarray) -> np.ndarray:
        tensor = torch.as_tensor(np.asarray(values, dtype=np.float64), device=self.world.device)
        return all_reduce(tensor, self.world, "sum").cpu().numpy()

    def _advantages(
        self,
        groups: list[Group],
        rewards: list[np.ndarray],
        sequences: list[Sequence],
        owners: list[tuple[int, int]],
        updates: list[MiniBatch],
    ) -> TokenAdvantages:
        """The algorithm's advantages of this rank's trajectories, written into their micro-batches (and the critic's
        returns beside them)."""
        algorithm = self.algorithm
        in_reward = algorithm.cfg.kl_in_reward
        beta = algorithm.kl_controller.value if in_reward else 0.0
        parts = [p for mini in updates for p in mini.micro_batches if p.sequences]
        trajectories: list[TrajectoryTokens] = []
        kl_sums = np.zeros(len(sequences))
        for part in parts:
            kls = (
                part.split(
                    kl_estimate(part.proximal_logprobs, part.ref_logprobs, algorithm.cfg.kl_estimator),
                    sequences,
                )
                if in_reward
                else None
            )
            values = part.split(part.old_values, sequences) if part.old_values is not None else None
            for k, i in enumerate(part.sequences):
                mask = sequences[i].loss_mask
                kl = kls[k] * (mask > 0) if kls is not None else None
                if kl is not None:
                    kl_sums[i] = kl.sum()
                group, sample = owners[i]
                trajectories.append(TrajectoryTokens(group, sample, mask, kl, values[k] if values else None))
        if in_reward:  # each rank summed its own trajectories' KL; every rank needs every group's scores
            kl_sums = self._sum_over_ranks(kl_sums)
        scores, offset = [], 0
        for r in rewards:
            scores.append(r - beta * kl_sums[offset : offset + len(r)])
            offset += len(r)
        batch = AdvantageBatch(groups, rewards, scores, trajectories, beta, self._sum_over_ranks)
        result = algorithm.token_advantages(batch)
        # back into the packed micro-batches, in the order the trajectories were listed
        position = 0
        for part in parts:
            count = len(part.sequences)
            keep = part.mb.keep
            part.mb.advantages[keep] = torch.from_numpy(
                np.concatenate(result.advantages[position : position + count]).astype(np.float32)
            )
            if result.returns is not None:
                returns = np.concatenate(result.returns[position : position + count]).astype(np.float32)
                part.returns = torch.from_numpy(returns).to(self.world.device)
            position += count
        if self.critic is not None:  # padding micro-batches: no loss token, any target
            for mini in updates:
                for part in mini.micro_batches:
                    if part.returns is None:
                        part.returns = torch.zeros(len(part.mb.keep), device=self.world.device)
        return result

    def _update(
        self, mini: MiniBatch, version: int, totals: StepTotals, train_policy: bool, at_start: bool = False
    ) -> None:
        """One optimizer update on a mini-batch: backward per micro-batch (gradient sync on the last), then step.
        `at_start`: the weights are still the step's starting ones (its first update)."""
        world = self.world
        # FSDP2 averages gradients over ranks; scaling by world_size makes the result the global token mean.
        scale = world.world_size / mini.loss_tokens
        # a non-finite loss on any rank skips the update on every rank (read once, at the step below)
        nonfinite = torch.zeros(2, device=world.device)  # policy, critic
        models = ([self.model] if train_policy else []) + ([self.critic.model] if self.critic else [])
        with synchronisation_check(self.sync_check, world.device):
            for i, part in enumerate(mini.micro_batches):
                last = i == len(mini.micro_batches) - 1
                mb = part.mb.to(world.device)
                self._fsdp_for_micro_batch(models, last)
                if train_policy:
                    loss, stats = self._micro_batch_loss(mb, version, part, at_start)
                    (loss * scale).backward()
                    nonfinite[0] += (~torch.isfinite(loss.detach())).float()
                    totals.model_tokens += mb.num_tokens
                    totals.add(stats)
                if self.critic is not None:
                    loss_mask = mb.loss_mask[mb.keep]
                    value_loss, stats = self.critic.loss(mb, part.old_values, part.returns, loss_mask)
                    (value_loss * scale).backward()
                    nonfinite[1] += (~torch.isfinite(value_loss.detach())).float()
                    totals.add_critic(value_loss, stats, loss_mask)
        totals.tokens += mini.loss_tokens
        all_reduce(nonfinite, world, "sum")
        nonfinite = nonfinite > 0
        if train_policy:
            grad_norm, skipped = clip_and_step(self.model, self.optimizer, self.cfg.grad_clip, nonfinite[0])
            totals.grad_norms.append(grad_norm)
            if skipped:
                totals.skipped_updates += 1
                log.warning("version %d: non-finite policy loss or gradient norm; update skipped", version)
        if self.critic is not None:
            grad_norm, skipped = self.critic.step(nonfinite[1])
            totals.critic_grad_norms.append(grad_norm)
            if skipped:
                log.warning(
                    "version %d: non-finite value loss or critic gradient norm; update skipped", version
                )

    def _fsdp_for_micro_batch(self, models: list[torch.nn.Module], last: bool) -> None:
        """FSDP2 for the next micro-batch of an update: reduce-scatter gradients now, or on the last one only; with
        parameters kept unsharded, no reshard after the backward until the last (the optimizer step then changes the
        shards, and the next forward gathers them again)."""
        for model in models:
            model.set_requires_gradient_sync(last or not self.execution.defer_grad_sync)
            if self.execution.keep_unsharded:
                model.set_reshard_after_backward(last)

    def _micro_batch_loss(
        self, mb: MicroBatch, version: int, part: PackedPart, at_start: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        # the entropy is computed for the `loss/entropy` metric in any case (one pass over each chunk of logits in the
        # forward); it gets a gradient, in the backward, only when the algorithm's loss uses it (see below)
        logprobs, entropy = token_logprobs(
            self.model, mb, self.temperature, with_entropy=True, **self.head_options
        )
        keep = mb.keep
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
            ref_logprobs=part.ref_logprobs,  # the reference's, computed before the first update
            proximal_logprobs=part.proximal_logprobs,
        )
        stats["pg_loss"] = per_token.detach()
        stats["entropy"] = entropy.detach()
        stats["staleness"] = staleness.to(torch.float64)
        stats["loss_mask"] = loss_mask
        # behaviour against the step's starting policy: its proximal pass, or these log-probs in the first update
        start = (
            part.proximal_logprobs if part.proximal_logprobs is not None else (logprobs if at_start else None)
        )
        stats |= offpolicy_stats(start, mb.behavior_logprobs[keep])
        return per_token.sum(), stats

    # -- what the engines get ----------------------------------------------------------------------------------
    def published_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The sharded tensors a publish sends (every rank, same order): the adapters under their PEFT names with
        LoRA, else every weight under its HF name."""
        return adapter_weights(self.model) if self.cfg.lora is not None else named_weights(self.model)

    def publish_extras(self) -> dict:
        """The update record's `adapter` (LoRA's adapter_config.json) and `probe` (the learner's log-probs of the
        last batch's first trajectory at this version, learner/probe.py). A collective (an FSDP forward): every
        rank calls it before each publish."""
        adapter = adapter_config(self.cfg.lora, str(self.model_path)) if self.cfg.lora is not None else None
        return {"adapter": adapter, "probe": self.probe.at(self.version)}

    # -- state a checkpoint keeps beside the weights ----------------------------------------------------------
    def resume_extra(self) -> dict:
        """What the step keeps across steps besides models and optimizers (the adaptive KL coefficient)."""
        return {"algorithm": self.algorithm.state_dict()}

    def restore_extra(self, extra: dict) -> None:
        self.algorithm.load_state_dict(extra.get("algorithm", {}))
