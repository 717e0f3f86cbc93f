"""PPO's value model: an HF causal LM's body with a scalar head, sharded with FSDP2 like the policy, its own AdamW.

    critic = Critic(cfg.learner.algorithm.critic, policy_path, world, betas=cfg.learner.betas)
    old_values = critic.values(mb)                            # no grad, before the step (keep-aligned, fp32)
    loss, stats = critic.loss(mb, old_values, returns, loss_mask)   # per token; backward like the policy's
    grad_norm, skipped = critic.step()                        # clip, AdamW; critic.scheduler steps once per batch

The model is transformers' token-classification class over the critic's checkpoint (`critic.model_path`, default the
policy's): the body's weights are the LM's, the LM head is dropped and a scalar head, zero-initialised (every value
starts at 0), reads the last hidden state. Under FSDP2 the same code runs on CPU/gloo and GPU/NCCL: each decoder
layer is a unit, the head sits in the root unit (learner/model.py). V at position t of a packed row is the value of
the state after token t, i.e. before the response token the log-probs put at t: values are read at `mb.keep`, aligned
with the policy's log-probs.

Value loss (clipped, as PPO2/verl, coefficient 1 with its own optimizer): with old values V_old from the step's
start, returns R from GAE (learner/algorithms/ppo.py) and new values V,
    V_clip = V_old + clip(V - V_old, -value_clip, value_clip),   loss_t = 0.5 * max((V - R)^2, (V_clip - R)^2)
over sampled tokens only, averaged over the (mini-)batch's sampled tokens like the policy loss.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

from learner.algorithms.settings import CriticConfig
from learner.distributed import World
from learner.model import build_optimizer, clip_and_step, load_policy
from learner.packing import MicroBatch, attention_kwargs


def value_head(model: torch.nn.Module) -> torch.nn.Linear:
    """The scalar head of a transformers token-classification model."""
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if not isinstance(head, torch.nn.Linear) or head.out_features != 1:
        raise ValueError(
            f"{type(model).__name__} has no one-output `score`/`classifier` head to use as a critic"
        )
    return head


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    value_clip: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped value loss (0 where loss_mask is 0) and per-token statistics."""
    mask = loss_mask.to(values.dtype)
    old_values, returns = old_values.to(values.dtype), returns.to(values.dtype)
    clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
    unclipped_error = (values - returns).square()
    clipped_error = (clipped_values - returns).square()
    loss = 0.5 * torch.maximum(unclipped_error, clipped_error) * mask
    with torch.no_grad():
        stats = {
            "value_clipped": (clipped_error > unclipped_error).to(values.dtype),
            "value": values.detach(),
            "return": returns,
        }
    return loss, stats


class Critic:
    def __init__(
        self,
        cfg: CriticConfig,
        policy_path: str | Path,
        world: World,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        dtype: str = "float32",
        cpu_offload: bool = False,
        **load_options,
    ):
        """`load_options`: how the policy's model is run (attention, checkpointing, compile, FSDP2 resharding:
        learner.model.load_policy's keywords, from learner/execution/plan.py); the critic runs the same way."""
        self.cfg = cfg
        self.world = world
        self.path = Path(cfg.model_path) if cfg.model_path else Path(policy_path)
        self.model = load_policy(
            self.path, world, dtype=dtype, cpu_offload=cpu_offload, value_head=True, **load_options
        )
        head = value_head(self.model)
        with torch.no_grad():  # every value starts at 0 (the shards of a DTensor are zeroed in place)
            head.weight.zero_()
            if head.bias is not None:
                head.bias.zero_()
        self.model.train()
        settings = SimpleNamespace(
            lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay, warmup_steps=cfg.warmup_steps
        )
        self.optimizer, self.scheduler = build_optimizer(self.model, settings)

    def _forward(self, mb: MicroBatch) -> torch.Tensor:
        with warnings.catch_warnings():
            # FSDP2 warns that the root module returned a view (the scalar head's Linear reshapes its 2-D product):
            # only in-place ops on it would be unsafe, and the values are read by a gather, a copy
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
            out = self.model(
                input_ids=mb.input_ids,
                position_ids=mb.position_ids,
                use_cache=False,
                **attention_kwargs(self.model, mb),
            )
        return out.logits[0, mb.keep, 0].float()

    def values(self, mb: MicroBatch) -> torch.Tensor:
        """V before every response token of the micro-batch (keep-aligned), without gradient."""
        with torch.no_grad():
            return self._forward(mb)

    def loss(
        self, mb: MicroBatch, old_values: torch.Tensor, returns: torch.Tensor, loss_mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch's summed clipped value loss (with gradient) and per-token statistics."""
        per_token, stats = clipped_value_loss(
            self._forward(mb), old_values, returns, loss_mask, self.cfg.value_clip
        )
        return per_token.sum(), stats

    def step(self, loss_nonfinite: torch.Tensor | None = None) -> tuple[torch.Tensor, bool]:
        """Clip the gradient and take an AdamW step, skipped when the value loss or the gradient norm is not finite
        (learner.model.clip_and_step); returns the norm before clipping (a device tensor) and whether it skipped."""
        return clip_and_step(self.model, self.optimizer, self.cfg.grad_clip, loss_nonfinite)
