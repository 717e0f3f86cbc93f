"""The algorithm and off-policy-correction config members of the `learner` section (data only, no torch).

    learner:
      algorithm: {type: grpo, clip_low: 0.2, clip_high: 0.28, kl_coef: 0.0, entropy_coef: 0.0}
      correction: {type: tis, cap: 2.0, proximal: recompute}

Both are discriminated unions on `type`: a variant's own fields sit with it, and a field of another variant (or an
unknown type) fails when the config is loaded. A bare string is shorthand for the variant with its defaults
(`learner.correction=icepop`). Each algorithm member names its class (`implementation`), which `build_algorithm`
builds. Adding an algorithm: one file in `learner/algorithms/` plus one member here.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


def variant_shorthand(value: Any) -> Any:
    """`"icepop"` -> `{"type": "icepop"}`, so a union section can be set by its variant's name alone."""
    return {"type": value} if isinstance(value, str) else value


# -- algorithms -------------------------------------------------------------------------------------------------


class PolicyLossConfig(BaseModel):
    """The PPO-clip policy loss every policy-gradient algorithm here trains with."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(description="Which algorithm (the union's tag).")
    clip_low: float = Field(0.2, ge=0, description="PPO clip epsilon below 1 (ratio >= 1 - clip_low).")
    clip_high: float = Field(0.28, ge=0, description="PPO clip epsilon above 1 (ratio <= 1 + clip_high).")
    kl_coef: float = Field(
        0.0, ge=0, description="Coefficient of the low_var_kl penalty to a frozen reference (0: off)."
    )
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")


class GRPOConfig(PolicyLossConfig):
    """GRPO: advantage (r - mean) / std within the group (DeepSeekMath, Shao et al. 2024)."""

    implementation: ClassVar[str] = "learner.algorithms.grpo:GRPO"

    type: Literal["grpo"] = Field("grpo", description="Which algorithm (the union's tag).")


class DrGRPOConfig(PolicyLossConfig):
    """Dr. GRPO: advantage r - mean within the group, no std (Liu et al. 2025)."""

    implementation: ClassVar[str] = "learner.algorithms.grpo:DrGRPO"

    type: Literal["drgrpo"] = Field("drgrpo", description="Which algorithm (the union's tag).")


AlgorithmConfig = Annotated[GRPOConfig | DrGRPOConfig, Field(discriminator="type")]


# -- off-policy corrections -------------------------------------------------------------------------------------

Proximal = Literal["recompute", "loglinear"]
CAP_DESCRIPTION = (
    "Importance-weight cap C: `tis` truncates the weight at C, `decoupled` masks tokens above C."
)
PROXIMAL_DESCRIPTION = (
    "How the proximal log-probs are obtained: a forward pass with the step's starting weights, or AReaL's "
    "log-linear interpolation from per-token versions."
)


class NoCorrection(BaseModel):
    """Plain PPO ratio against the behaviour log-probs of the engine that sampled the token."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["none"] = Field("none", description="Which correction (the union's tag).")


class TISCorrection(BaseModel):
    """Truncated importance sampling between the proximal and the behaviour policy."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["tis"] = Field("tis", description="Which correction (the union's tag).")
    cap: float = Field(2.0, gt=0, description=CAP_DESCRIPTION)
    proximal: Proximal = Field("recompute", description=PROXIMAL_DESCRIPTION)


class IcePopCorrection(BaseModel):
    """IcePop: tokens whose importance weight falls outside [low, high] are masked out."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["icepop"] = Field("icepop", description="Which correction (the union's tag).")
    low: float = Field(0.5, gt=0, description="Weights below this are masked out.")
    high: float = Field(2.0, gt=0, description="Weights above this are masked out.")
    proximal: Proximal = Field("recompute", description=PROXIMAL_DESCRIPTION)

    @model_validator(mode="after")
    def _band(self) -> IcePopCorrection:
        if self.low >= self.high:
            raise ValueError(f"icepop low ({self.low}) must be < high ({self.high})")
        return self


class DecoupledCorrection(BaseModel):
    """AReaL's decoupled PPO: like `tis`, but tokens whose weight exceeds the cap are masked, not truncated."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["decoupled"] = Field("decoupled", description="Which correction (the union's tag).")
    cap: float = Field(2.0, gt=0, description=CAP_DESCRIPTION)
    proximal: Proximal = Field("recompute", description=PROXIMAL_DESCRIPTION)


CorrectionConfig = Annotated[
    NoCorrection | TISCorrection | IcePopCorrection | DecoupledCorrection, Field(discriminator="type")
]
