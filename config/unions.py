"""How the config layer reads a union section: the models it may hold, and the field that picks one (its tag).

A closed union is pydantic's discriminated union (`learner.algorithm`: `Annotated[GRPOConfig | ..., Field(
discriminator="type")]`). An open one is a base model whose members register themselves (`retrieval.retriever`:
`retrieval.union.RetrieverSettings`), saying so with a `union_tag` class attribute and a `union_members()`
classmethod. The loader, the strict checks and the reference walk both the same way.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def section_models(annotation: Any) -> list[type[BaseModel]]:
    """The models a field holds: one for a section, every member for a union section (`learner.correction`,
    `retrieval.retriever`), none for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        members = getattr(annotation, "union_members", None)
        return list(members()) if members is not None else [annotation]
    if typing.get_origin(annotation) is typing.Annotated:
        return section_models(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in section_models(arg)]
    return []


def union_tag(field: FieldInfo) -> str | None:
    """The name of the field that picks a union section's member (`type`, `method`); None for any other field."""
    if isinstance(field.discriminator, str):
        return field.discriminator
    annotation = field.annotation
    tag = getattr(annotation, "union_tag", None) if isinstance(annotation, type) else None
    return tag if isinstance(tag, str) else None
