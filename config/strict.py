"""Checks pydantic's lax mode lets through, applied to every numeric field of every section at once.

    boolean_numbers({"learner": {"max_staleness": True}}, Config)   # ["learner.max_staleness: ..."]
    non_finite_numbers(cfg)                                         # ["learner.lr: ... (got inf)"]

Pydantic turns `true` into 1 for an integer field and accepts `1e999` (inf) and `nan` for a float field. Neither is
ever what a user meant, so the loader (`config/loader.py`) refuses both, naming the key, for presets, job files,
environment variables and dotted overrides alike. Walking the models generically keeps a new field covered without
a validator of its own.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

from pydantic import BaseModel

from config.unions import section_models


def _members(annotation: Any) -> list[Any]:
    """The types a field admits: Optional/Union/Annotated unwrapped (one level of containers is kept as is)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    return [annotation]


def _takes_numbers_not_booleans(annotation: Any) -> bool:
    members = _members(annotation)
    if bool in members or Any in members:
        return False
    return any(m in (int, float) for m in members)


def _item_annotation(annotation: Any) -> Any | None:
    """The element type of a `list[X]` / `tuple[X, ...]` field (the first container among the union's members)."""
    for member in _members(annotation):
        if typing.get_origin(member) in (list, tuple, set) and typing.get_args(member):
            return typing.get_args(member)[0]
    return None


def boolean_numbers(values: dict[str, Any], model: type[BaseModel], prefix: str = "") -> list[str]:
    """Keys of `values` (raw, as read from YAML or overrides) that give a boolean to a number field."""
    return _boolean_numbers(values, dict(model.model_fields), prefix)


def _boolean_numbers(values: dict[str, Any], fields: dict[str, Any], prefix: str) -> list[str]:
    problems = []
    for key, value in values.items():
        field = fields.get(key)
        if field is None:
            continue  # unknown keys are reported by the loader with close matches
        dotted = f"{prefix}{key}"
        sections = section_models(field.annotation)
        if isinstance(value, dict) and sections:
            merged: dict[str, Any] = {}
            for section in sections:  # a union section: every variant's fields
                for name, sub in section.model_fields.items():
                    merged.setdefault(name, sub)
            problems += _boolean_numbers(value, merged, f"{dotted}.")
        elif isinstance(value, bool) and _takes_numbers_not_booleans(field.annotation):
            problems.append(f"{dotted}: expected a number, got the boolean {value!r}")
        elif isinstance(value, list):
            item = _item_annotation(field.annotation)
            if (
                item is not None
                and _takes_numbers_not_booleans(item)
                and any(isinstance(v, bool) for v in value)
            ):
                problems.append(f"{dotted}: expected a list of numbers, got {value!r}")
    return problems


def non_finite_numbers(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted keys of every float in `model` (sections, lists and mappings included) that is inf or nan."""
    problems = []
    for name in type(model).model_fields:
        problems += _non_finite(getattr(model, name), f"{prefix}{name}")
    return problems


def _non_finite(value: Any, where: str) -> list[str]:
    if isinstance(value, BaseModel):
        return non_finite_numbers(value, f"{where}.")
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where}: must be a finite number (got {value})"]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _non_finite(v, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _non_finite(v, f"{where}.{k}")]
    return []
