"""The building blocks of a `sr1 plan` profile: a number with its source (`Figure`), a rate against concurrency with
its source (`Curve`), and a decoder's shape with its source (`ModelShape`, what the LoRA figures are derived from).

    Figure(value=11728, source="measured 2026-11-26 ...")
    Curve(points=[(1, 250), (16, 3500)], source="...").at(8)
    ModelShape(hidden=2048, intermediate=11008, layers=36, heads=16, kv_heads=2, vocab=151936, source="config.json")
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Figure(BaseModel):
    """One number and where it came from."""

    model_config = ConfigDict(extra="forbid")

    value: float = Field(description="The number, in the unit its field names.")
    source: str = Field(
        min_length=1,
        description="Where it came from: a measurement with its command and date, a "
        "published figure with its reference, or 'assumption: <why>'.",
    )


class Curve(BaseModel):
    """A server's aggregate rate as a function of the jobs it serves at once: an engine's decode tokens/s against
    concurrent sequences, a retrieval server's requests/s against concurrent clients."""

    model_config = ConfigDict(extra="forbid")

    points: list[tuple[float, float]] = Field(
        description="(concurrent jobs, aggregate rate) pairs; linear in between, flat past the last."
    )
    source: str = Field(min_length=1, description="Where the points came from.")

    @model_validator(mode="after")
    def _increasing(self) -> Curve:
        xs = [x for x, _ in self.points]
        if not self.points or xs != sorted(xs) or len(set(xs)) != len(xs) or xs[0] <= 0:
            raise ValueError(f"points need distinct, increasing concurrencies > 0, got {xs}")
        if any(y <= 0 for _, y in self.points):
            raise ValueError("the rate must be > 0 at every point")
        return self

    def at(self, concurrent: int) -> float:
        """The aggregate rate at `concurrent` jobs (through the origin below the first point)."""
        if concurrent <= 0:
            return 0.0
        (x0, y0) = self.points[0]
        if concurrent <= x0:
            return y0 * concurrent / x0
        for (xa, ya), (xb, yb) in zip(self.points, self.points[1:], strict=False):
            if concurrent <= xb:
                return ya + (yb - ya) * (concurrent - xa) / (xb - xa)
        return self.points[-1][1]


class ModelShape(BaseModel):
    """A Qwen2-like decoder's shape: what the LoRA adapter's size and the learner's memory estimate need."""

    model_config = ConfigDict(extra="forbid")

    hidden: int = Field(gt=0, description="hidden_size")
    intermediate: int = Field(gt=0, description="intermediate_size (the MLP's width)")
    layers: int = Field(gt=0, description="num_hidden_layers")
    heads: int = Field(gt=0, description="num_attention_heads")
    kv_heads: int = Field(gt=0, description="num_key_value_heads")
    vocab: int = Field(gt=0, description="vocab_size")
    source: str = Field(min_length=1, description="Where the shape came from (the model's config.json).")
