"""The one decoder for JSON read back from Redis: heartbeats, evaluation requests and results, the weight-sync
rendezvous and its updates.

    info = decode_json(raw, "the heartbeat of worker gen-0")      # a dict, or MalformedJSON naming what it was

Anyone who reaches the run's Redis (or a bug in an older process) can leave a value there that is not what its reader
expects. `json.loads` alone would surface that as a bare `JSONDecodeError` or a `KeyError` far from the read; here it
is one error that says what was being decoded, what was expected and how the value starts.
"""

from __future__ import annotations

import json
from typing import Any

_SHOWN_CHARS = 120


class MalformedJSON(ValueError):
    """A value read from Redis that is not the JSON its reader expects; the message names what was decoded."""


def decode_json(raw: bytes | str, what: str, expect: type = dict) -> Any:
    """`raw` decoded as JSON, which must be an `expect` (a dict unless told); MalformedJSON naming `what` if not."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    try:
        value = json.loads(text)
    except ValueError as err:
        raise MalformedJSON(f"{what} is not valid JSON ({err}): {text[:_SHOWN_CHARS]!r}") from None
    if not isinstance(value, expect):
        raise MalformedJSON(
            f"{what} must be a JSON {_kind(expect)}, got a {_kind(type(value))}: {text[:_SHOWN_CHARS]!r}"
        )
    return value


def _kind(cls: type) -> str:
    return {dict: "object", list: "array", str: "string", int: "number", float: "number"}.get(
        cls, cls.__name__
    )
