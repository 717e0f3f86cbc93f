"""Search-R1's (verl's) overrides translated into sr1's config, with the key table of `config/search_r1_keys.py`.

    sr1 config show tiny actor_rollout_ref.actor.optim.lr=1e-6       # -> learner.lr: 1.0e-06
    sr1 run search-r1-grpo-8xh100 actor_rollout_ref.rollout.n_agent=8 retriever.topk=5

Overrides in this vocabulary go through `translate`, in the table's order (a rule may read what an earlier one set);
a key it does not know is left to sr1's own keys, whose error then also names the closest Search-R1 keys
(`unknown_key_hint`). `sr1 config from-search-r1 SCRIPT` translates a whole training script
(`config/search_r1_script.py`).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from config.search_r1_keys import KEYS, Lookup, Rule

_TOP_LEVEL = {key.split(".")[0] for key in KEYS}


def is_search_r1_key(dotted: str) -> bool:
    """Whether an override's key is in Search-R1's vocabulary (`+key` and `++key`, Hydra's appends, included)."""
    return dotted.lstrip("+") in KEYS


_INTERPOLATION = re.compile(r"^\$\{([\w.]+)\}$")


def resolve_interpolations(values: dict[str, Any]) -> dict[str, Any]:
    """`${a.b}` values replaced by the value of `a.b` (followed through chains), as Hydra resolves them."""
    resolved = {}
    for key, value in values.items():
        seen = {key}
        while isinstance(value, str) and (match := _INTERPOLATION.match(value)):
            target = match.group(1)
            if target in seen or target not in values:
                raise ValueError(f"{key}: cannot resolve {value!r}")
            seen.add(target)
            value = values[target]
        resolved[key] = value
    return resolved


@dataclass
class Translation:
    """sr1 values from Search-R1 keys, and where each came from."""

    values: dict[str, Any] = field(default_factory=dict)  # sr1 dotted key -> value
    origin: dict[str, str] = field(default_factory=dict)  # sr1 dotted key -> the Search-R1 key that set it
    notes: dict[str, str] = field(default_factory=dict)  # Search-R1 key -> what became of it (one line)


class TranslationError(ValueError):
    """A Search-R1 key with a value sr1 cannot take; the message names both spellings."""


def translate(given: dict[str, Any], base: Lookup) -> Translation:
    """sr1 values for Search-R1 keys (`given`: key -> parsed value), in the table's order; `base` answers sr1 keys the
    translation does not set (the preset and sr1 overrides below)."""
    out = Translation()

    def lookup(sr1_key: str) -> Any:
        return out.values[sr1_key] if sr1_key in out.values else base(sr1_key)

    for key, rule in KEYS.items():
        if key not in given:
            continue
        value = given[key]
        if rule.only is not None and value not in rule.only:
            allowed = " or ".join(repr(v) for v in rule.only)
            raise TranslationError(f"{key}={value!r}: sr1 takes only {allowed} here: {rule.note}")
        try:
            update = (
                rule.convert(value, lookup) if rule.convert else {rule.sets[0]: value} if rule.sets else {}
            )
        except (TypeError, ValueError) as err:
            target = " / ".join(rule.sets) or "no sr1 field"
            raise TranslationError(f"{key}={value!r} (sr1: {target}): {err}") from None
        for sr1_key, sr1_value in update.items():
            out.values[sr1_key] = sr1_value
            out.origin[sr1_key] = key
        out.notes[key] = _describe(key, rule, update)
    return out


def _describe(key: str, rule: Rule, update: dict[str, Any]) -> str:
    if update:
        sets = ", ".join(f"{k}={v!r}" for k, v in update.items())
        return f"{key} -> {sets}" + (f" ({rule.note})" if rule.note else "")
    if rule.sets:
        return f"{key}: nothing to set ({rule.note})"
    return f"{key}: accepted; {rule.note}"


def unknown_key_hint(dotted: str, sr1_keys: list[str]) -> str:
    """The closest sr1 and Search-R1 keys to an unknown key, for its error message."""
    key = dotted.lstrip("+")
    parts = []
    close_sr1 = _closest(key, sr1_keys)
    if close_sr1:
        parts.append(f"closest sr1 keys: {', '.join(close_sr1)}")
    close_theirs = _closest(key, list(KEYS))
    if close_theirs:
        parts.append(f"closest Search-R1 keys: {', '.join(close_theirs)}")
    return "; ".join(parts)


def _closest(key: str, candidates: list[str]) -> list[str]:
    close = difflib.get_close_matches(key, candidates, n=3, cutoff=0.6)
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = [c for c in candidates if difflib.get_close_matches(leaf, [c.rsplit(".", 1)[-1]], cutoff=0.8)]
    return list(dict.fromkeys(close + by_leaf))[:3]


def looks_like_search_r1(dotted: str) -> bool:
    """A key whose first part is one of Search-R1's (`actor_rollout_ref.`, `trainer.`, ...; `data.` is sr1's too)."""
    return dotted.lstrip("+").split(".")[0] in _TOP_LEVEL
