"""The algorithm and off-policy-correction config members of the `learner` section (data only, no torch).

    learner:
      algorithm: {type: grpo, clip_low: 0.2, clip_high: 0.28, kl_coef: 0.0, entropy_coef: 0.0}
      correction: {type: tis, cap: 2.0, proximal: recompute}

    learner:
      algorithm:
        type: ppo
        gamma: 1.0
        lam: 1.0
        kl_coef: 0.001
        kl_placement: reward
        kl_estimator: k1
        critic: {lr: 1.0e-5, warmup_steps: 15, value_clip: 0.5}

Both are families of variants on `type` (`common/variants.py`: `ALGORITHMS`, `CORRECTIONS`): a variant's own fields
sit with it, and a field of another variant (or an unknown type) fails when the config is loaded. A bare string is
shorthand for the variant with its defaults (`learner.correction=icepop`, `learner.algorithm=rloo`). A member owns
the facts the rest reads (`needs_critic`, `group_baseline`, `needs_reference`; a correction's `uses_proximal` and
its weight rule `weigh`) and builds its algorithm (`build`: its `implementation`, imported only then, so this module
loads without torch). Adding an algorithm: its file in `learner/algorithms/` and its member here, registered in
`ALGORITHMS`; the learner, the config checks and the planner read its facts. A member with `needs_critic` carries a
`critic` section (`CriticConfig`), which the learner's critic is built from.

Every member shares the policy loss (PPO-clip), the KL term (in the loss or in the reward, with its estimator and
controller), the entropy bonus and DAPO's options (dynamic sampling, overlong shaping); only `ppo` has a critic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.imports import import_object
from common.variants import Family

if TYPE_CHECKING:
    import torch


# -- the shared parts of every algorithm ---------------------------------------------------------------------

KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]
GAMMA_DESCRIPTION = (
    "Discount per time step (sampled token; observation tokens are not steps) of the returns and GAE."
)


class KLControlConfig(BaseModel):
    """How the KL coefficient moves: fixed, or adaptive towards a target KL (Ziegler et al. 2019, section 2.2)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["fixed", "adaptive"] = Field(
        "fixed", description="fixed: the coefficient stays at kl_coef; adaptive: it follows target_kl."
    )
    target_kl: float = Field(
        0.1,
        gt=0,
        description="adaptive: the KL per token (mean over the batch's loss tokens) to steer towards.",
    )
    horizon: int = Field(
        10000,
        ge=1,
        description="adaptive: coef *= 1 + clip(kl / target_kl - 1, -0.2, 0.2) * trajectories / horizon per step.",
    )


class OverlongConfig(BaseModel):
    """DAPO's overlong reward shaping (Yu et al. 2025, section 3.4), over the response token budget
    (`generators.max_response_tokens`: sampled and observation tokens, the budget the agent loop enforces)."""

    model_config = ConfigDict(extra="forbid")

    mask_truncated: bool = Field(
        False,
        description="Overlong filtering: trajectories cut by the token budget (finish reason `budget`) get no loss "
        "(they still count in their group's baseline).",
    )
    buffer_tokens: int = Field(
        0,
        ge=0,
        description="Soft overlong punishment: within this many tokens of the budget the reward falls linearly to "
        "-penalty at the budget (0: off).",
    )
    penalty: float = Field(1.0, ge=0, description="The soft punishment at the budget itself (DAPO: 1).")


class PolicyLossConfig(BaseModel):
    """The PPO-clip policy loss every policy-gradient algorithm here trains with, and its KL and DAPO options."""

    model_config = ConfigDict(extra="forbid")

    # the facts a member owns, read by the config's checks, the learner and the planner (none repeats them)
    # whether the advantage compares a trajectory with the other samples of its group (a group of one has none)
    group_baseline: ClassVar[bool] = False
    # whether the step trains a value model beside the policy (its values before the step, its returns after)
    needs_critic: ClassVar[bool] = False
    # the `learner.algorithms.base.Algorithm` that implements it, by import path: imported when built, so these
    # settings load without torch (and the implementation may import them)
    implementation: ClassVar[str] = ""

    type: str = Field(description="Which algorithm (the union's tag).")
    clip_low: float = Field(0.2, ge=0, description="PPO clip epsilon below 1 (ratio >= 1 - clip_low).")
    clip_high: float = Field(0.28, ge=0, description="PPO clip epsilon above 1 (ratio <= 1 + clip_high).")
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="Coefficient of the KL to a frozen reference (the start value under an adaptive kl_ctrl; 0: no "
        "reference model, no KL).",
    )
    kl_placement: Literal["loss", "reward"] = Field(
        "loss",
        description="loss: kl_coef * KL added to the per-token loss (GRPO's way); reward: -kl_coef * KL of each "
        "sampled token added to the reward before advantages (PPO's and REINFORCE++'s way).",
    )
    kl_estimator: KLEstimator = Field(
        "low_var_kl",
        description="Per-token KL estimate from the sampled token: k1 = log p - log p_ref, k2 = (k1)^2 / 2, "
        "k3 = exp(-k1) + k1 - 1, low_var_kl = k3 clamped to [-10, 10] (Schulman 2020).",
    )
    kl_ctrl: KLControlConfig = Field(
        default_factory=KLControlConfig,
        description="The KL coefficient's controller: {type: fixed|adaptive, ...}.",
    )
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: groups whose rewards are all equal are dropped when they arrive and "
        "replaced by new prompts, so every batch holds groups_per_step informative groups.",
    )
    overlong: OverlongConfig = Field(
        default_factory=OverlongConfig,
        description="DAPO's overlong shaping: {mask_truncated, buffer_tokens, penalty}.",
    )

    @model_validator(mode="after")
    def _kl_needs_a_coefficient(self) -> PolicyLossConfig:
        if self.kl_ctrl.type == "adaptive" and self.kl_coef == 0:
            raise ValueError("kl_ctrl.type adaptive needs kl_coef > 0 (its start value; 0 stays 0)")
        return self

    @property
    def kl_in_reward(self) -> bool:
        return self.kl_coef > 0 and self.kl_placement == "reward"

    @property
    def needs_reference(self) -> bool:
        """Whether the learner keeps a frozen copy of the initial policy (a KL penalty)."""
        return self.kl_coef > 0

    def build(self, correction: CorrectionSettings) -> Any:
        """The algorithm (a `learner.algorithms.base.Algorithm`) these settings describe, with its correction."""
        if not self.implementation:
            raise NotImplementedError(f"{type(self).__name__} names no implementation to build")
        return import_object(self.implementation)(self, correction)


# -- algorithms -------------------------------------------------------------------------------------------------


class GRPOConfig(PolicyLossConfig):
    """GRPO: advantage (r - mean) / std within the group (DeepSeekMath, Shao et al. 2024)."""

    group_baseline: ClassVar[bool] = True
    implementation: ClassVar[str] = "learner.algorithms.grpo:GRPO"

    type: Literal["grpo"] = Field("grpo", description="Which algorithm (the union's tag).")


class DrGRPOConfig(PolicyLossConfig):
    """Dr. GRPO: advantage r - mean within the group, no std (Liu et al. 2025)."""

    group_baseline: ClassVar[bool] = True
    implementation: ClassVar[str] = "learner.algorithms.grpo:DrGRPO"

    type: Literal["drgrpo"] = Field("drgrpo", description="Which algorithm (the union's tag).")


class RLOOConfig(PolicyLossConfig):
    """RLOO: advantage r_i - mean of the other samples' rewards (Ahmadian et al. 2024)."""

    group_baseline: ClassVar[bool] = True
    implementation: ClassVar[str] = "learner.algorithms.rloo:RLOO"

    type: Literal["rloo"] = Field("rloo", description="Which algorithm (the union's tag).")


class ReinforcePPConfig(PolicyLossConfig):
    """REINFORCE++: token-level KL in the reward, returns-to-go, advantages normalised over the batch (Hu 2025)."""

    implementation: ClassVar[str] = "learner.algorithms.reinforce:ReinforcePP"

    type: Literal["reinforce_pp"] = Field("reinforce_pp", description="Which algorithm (the union's tag).")
    kl_coef: float = Field(
        0.001,
        ge=0,
        description="Coefficient of the KL to a frozen reference (the start value under an adaptive kl_ctrl; 0: no "
        "reference model, no KL).",
    )
    kl_placement: Literal["loss", "reward"] = Field(
        "reward",
        description="loss: kl_coef * KL added to the per-token loss; reward: -kl_coef * KL of each sampled token "
        "added to the reward (REINFORCE++'s way).",
    )
    kl_estimator: KLEstimator = Field(
        "k1", description="Per-token KL estimate (k1, k2, k3, low_var_kl; see grpo's description)."
    )
    gamma: float = Field(1.0, ge=0, le=1, description=GAMMA_DESCRIPTION)


class ReinforceBaselineConfig(PolicyLossConfig):
    """REINFORCE with a group baseline (REINFORCE++-baseline): r - group mean, normalised over the whole batch."""

    group_baseline: ClassVar[bool] = True
    implementation: ClassVar[str] = "learner.algorithms.reinforce:ReinforceBaseline"

    type: Literal["reinforce_baseline"] = Field(
        "reinforce_baseline", description="Which algorithm (the union's tag)."
    )


class CriticConfig(BaseModel):
    """PPO's value model: an HF causal LM's body with a scalar head, sharded like the policy, its own optimizer."""

    model_config = ConfigDict(extra="forbid")

    model_path: str | None = Field(
        None,
        description="HF model directory the critic starts from (None: the policy's model.path); its LM head is "
        "replaced by a zero-initialised scalar value head.",
    )
    lr: float = Field(1e-5, gt=0, description="Peak learning rate of the critic (AdamW).")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps of the critic's learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay of the critic.")
    grad_clip: float = Field(1.0, gt=0, description="Clip the critic's global gradient norm to this value.")
    value_clip: float = Field(
        0.5,
        gt=0,
        description="Value clipping: a new value may move at most this far from the step's old value.",
    )


class PPOConfig(PolicyLossConfig):
    """PPO with a critic: GAE over the sampled tokens, a clipped value loss (Schulman et al. 2017)."""

    needs_critic: ClassVar[bool] = True
    implementation: ClassVar[str] = "learner.algorithms.ppo:PPO"

    type: Literal["ppo"] = Field("ppo", description="Which algorithm (the union's tag).")
    gamma: float = Field(1.0, ge=0, le=1, description=GAMMA_DESCRIPTION)
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    whiten_advantages: bool = Field(
        True, description="Normalise the advantages over the batch's sampled tokens (mean 0, std 1)."
    )
    critic_warmup: int = Field(
        0, ge=0, description="Steps at the start that train only the critic (the policy stays as it is)."
    )
    critic: CriticConfig = Field(
        default_factory=CriticConfig, description="The value model and its optimizer."
    )


# the algorithm family, chosen by `learner.algorithm.type`; the first member is the default. Adding an algorithm: its
# module in `learner/algorithms/`, its member above (naming it as `implementation`) and its line here.
ALGORITHMS = Family(PolicyLossConfig, tag="type", section="learner.algorithm", noun="algorithm")
for _member in (GRPOConfig, DrGRPOConfig, RLOOConfig, ReinforcePPConfig, ReinforceBaselineConfig, PPOConfig):
    ALGORITHMS.register(_member)
AlgorithmConfig = ALGORITHMS.choice


# -- off-policy corrections -------------------------------------------------------------------------------------

Proximal = Literal["recompute", "loglinear"]
CAP_DESCRIPTION = (
    "Importance-weight cap C: `tis` truncates the weight at C, `decoupled` masks tokens above C."
)
PROXIMAL_DESCRIPTION = (
    "How the proximal log-probs are obtained: a forward pass with the step's starting weights, or AReaL's "
    "log-linear interpolation from per-token versions."
)


class CorrectionSettings(BaseModel):
    """Base of every off-policy correction: its tag, the facts the trainer reads and its weight rule
    (`corrections.py` applies it)."""

    model_config = ConfigDict(extra="forbid")

    # whether the ratio is taken against the proximal policy (the step's start) and weighted back to the behaviour
    # one; False: the plain ratio against the behaviour log-probs, weight 1
    uses_proximal: ClassVar[bool] = True

    type: str = Field(description="Which correction (the union's tag).")

    @property
    def recomputes_proximal(self) -> bool:
        """Whether the proximal log-probs are the step's starting policy's own (a forward pass when the step makes
        several updates), rather than none or the log-linear approximation."""
        return self.uses_proximal and getattr(self, "proximal", None) == "recompute"

    def weigh(self, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight w, masked-out tokens) from the raw importance weights exp(l_p - l_mu), per token."""
        raise NotImplementedError(f"{type(self).__name__} does not say how it weighs a token")


class NoCorrection(CorrectionSettings):
    """Plain PPO ratio against the behaviour log-probs of the engine that sampled the token."""

    uses_proximal: ClassVar[bool] = False

    type: Literal["none"] = Field("none", description="Which correction (the union's tag).")


class TISCorrection(CorrectionSettings):
    """Truncated importance sampling between the proximal and the behaviour policy."""

    type: Literal["tis"] = Field("tis", description="Which correction (the union's tag).")
    cap: float = Field(2.0, gt=0, description=CAP_DESCRIPTION)
    proximal: Proximal = Field("recompute", description=PROXIMAL_DESCRIPTION)

    def weigh(self, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        return raw.clamp(max=self.cap), torch.zeros_like(raw, dtype=torch.bool)


class IcePopCorrection(CorrectionSettings):
    """IcePop: tokens whose importance weight falls outside [low, high] are masked out."""

    type: Literal["icepop"] = Field("icepop", description="Which correction (the union's tag).")
    low: float = Field(0.5, gt=0, description="Weights below this are masked out.")
    high: float = Field(2.0, gt=0, description="Weights above this are masked out.")
    proximal: Proximal = Field("recompute", description=PROXIMAL_DESCRIPTION)

    @model_validator(mode="after")
    def _band(self) -> IcePopCorrection:
        if self.low >= self.high:
            raise ValueError(f"icepop low ({self.low}) must be < high ({self.high})")
        return self

    def weigh(self, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return masked_weights(raw, (raw < self.low) | (raw > self.high))


class DecoupledCorrection(CorrectionSettings):
    """AReaL's decoupled PPO: like `tis`, but tokens whose weight exceeds the cap are masked, not truncated."""

    type: Literal["decoupled"] = Field("decoupled", description="Which correction (the union's tag).")
    cap: float = Field(2.0, gt=0, description=CAP_DESCRIPTION)
    proximal: Proximal = Field("recompute", description=PROXIMAL_DESCRIPTION)

    def weigh(self, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return masked_weights(raw, raw > self.cap)


def masked_weights(raw: torch.Tensor, masked_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The raw weights with the masked-out tokens' set to 0, and the mask."""
    import torch

    return torch.where(masked_out, torch.zeros_like(raw), raw), masked_out


# the correction family, chosen by `learner.correction.type`; adding one: its member above (with `weigh`) and its line
CORRECTIONS = Family(CorrectionSettings, tag="type", section="learner.correction", noun="correction")
for _member in (NoCorrection, TISCorrection, IcePopCorrection, DecoupledCorrection):
    CORRECTIONS.register(_member)
CorrectionConfig = CORRECTIONS.choice
