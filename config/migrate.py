"""Old config keys that still load, with a warning naming the new key.

The flat learner keys of earlier versions moved into the algorithm and correction unions, and the reward moved to the
task section:

    learner.advantage: drgrpo          ->  learner.algorithm.type: drgrpo
    learner.clip_low / clip_high / kl_coef / entropy_coef  ->  learner.algorithm.<same>
    learner.proximal / tis_cap / icepop_low / icepop_high  ->  learner.correction.proximal / cap / low / high
    generators.reward: f1              ->  task.reward: f1

A moved correction knob that the chosen correction does not have (`tis_cap` beside `correction: icepop`, which every
saved config of an earlier version holds) was ignored then and is dropped now, so old run directories resume as they
were. `learner.correction: icepop` needs no migration: a bare variant name is the union's shorthand.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("config")

RENAMED: dict[str, str] = {
    "generators.reward": "task.reward",
    "learner.advantage": "learner.algorithm.type",
    "learner.clip_low": "learner.algorithm.clip_low",
    "learner.clip_high": "learner.algorithm.clip_high",
    "learner.kl_coef": "learner.algorithm.kl_coef",
    "learner.entropy_coef": "learner.algorithm.entropy_coef",
    "learner.proximal": "learner.correction.proximal",
    "learner.tis_cap": "learner.correction.cap",
    "learner.icepop_low": "learner.correction.low",
    "learner.icepop_high": "learner.correction.high",
}
_CORRECTION_FIELDS = {
    "none": set(),
    "tis": {"cap", "proximal"},
    "icepop": {"low", "high", "proximal"},
    "decoupled": {"cap", "proximal"},
}


def renamed_key(dotted: str, origin: str) -> str:
    """The current name of a dotted key (a deprecated one is logged)."""
    new = RENAMED.get(dotted)
    if new is None:
        return dotted
    log.warning("%s: config key %r is deprecated; use %r", origin, dotted, new)
    return new


def migrate(values: dict[str, Any], origin: str) -> dict[str, Any]:
    """Move deprecated keys of one source (a YAML file) to their new places, in place; returns `values`."""
    moved_correction: set[str] = set()
    for old, new in RENAMED.items():
        section, key = old.split(".")
        if not isinstance(values.get(section), dict) or key not in values[section]:
            continue
        value = values[section].pop(key)
        target = values
        *parents, leaf = renamed_key(old, origin).split(".")
        for parent in parents:
            node = target.get(parent)
            if isinstance(node, str):  # `correction: tis` as the shorthand
                node = {"type": node}
            target[parent] = node if isinstance(node, dict) else {}
            target = target[parent]
        target.setdefault(leaf, value)
        if new.startswith("learner.correction."):
            moved_correction.add(leaf)
    correction = (
        values.get("learner", {}).get("correction") if isinstance(values.get("learner"), dict) else None
    )
    if isinstance(correction, dict) and correction.get("type") in _CORRECTION_FIELDS:
        for leaf in moved_correction - _CORRECTION_FIELDS[correction["type"]]:
            correction.pop(leaf)  # a knob of another correction, ignored by earlier versions too
    return values
