"""Objects named by import path ("package.module:attribute"): plug-ins from outside the repository, such as a user's
`task.reward_function`, and the implementation a variant's settings name (`common/variants.py`), imported when
built so that the settings load without it."""

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
