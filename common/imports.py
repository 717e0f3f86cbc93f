"""Implementations named by import path ("package.module:attribute"), so that config sections and registries can
name the class behind a variant without importing it (and torch, vLLM, faiss with it) when the config is loaded."""

from __future__ import annotations

import importlib
from typing import Any


def import_object(target: str) -> Any:
    """The object `target` names, as "package.module:attribute[.attribute]"."""
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
