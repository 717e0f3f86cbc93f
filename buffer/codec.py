"""msgpack codec for the records that cross Redis: raw array bytes, an explicit schema version, never pickle.

    payload = encode_group(group); group = decode_group(payload)

A prompt is one msgpack map. A group is a msgpack stream of two objects: a map (schema, ids, per-trajectory
lengths, rewards, infos) and one `bin` holding every array of every trajectory back to back (field by field in
`TRAJECTORY_ARRAYS` order, each field concatenated over the trajectories). Any msgpack reader can read it; this one
reads the map and then points numpy views into the bin without copying it, and validates the arrays in a few
vectorized checks per group.

Any payload that is not a well-formed group of the current schema raises `CodecError` saying what was wrong; the
buffer counts those and moves them aside instead of crashing its consumer.
"""

from __future__ import annotations

import io
import itertools
import math
from typing import Any

import msgpack
import numpy as np

from buffer.records import TRAJECTORY_ARRAYS, Group, PromptRecord, Trajectory

SCHEMA_VERSION = 1


class CodecError(ValueError):
    """A payload that cannot be decoded into a record of the current schema."""


def _pack(obj: dict[str, Any]) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(payload: bytes, kind: str, header_only: bool = False) -> tuple[dict[str, Any], int]:
    """The leading msgpack map of a payload and the offset where it ends (the payload's end unless
    `header_only`: then whatever follows is left for the caller)."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise CodecError(f"{kind} payload must be bytes, got {type(payload).__name__}")
    try:
        if header_only:  # a file-like source: the unpacker copies only small chunks, never the whole payload
            unpacker = msgpack.Unpacker(io.BytesIO(payload), raw=False, strict_map_key=True, read_size=4096)
            obj = unpacker.unpack()
            end = unpacker.tell()
        else:
            obj, end = msgpack.unpackb(payload, raw=False, strict_map_key=True), len(payload)
    except Exception as err:  # msgpack raises several unrelated types for garbage input
        raise CodecError(
            f"{kind} payload is not valid msgpack ({len(payload)} bytes): {type(err).__name__} {err}"
        ) from None
    if not isinstance(obj, dict):
        raise CodecError(f"{kind} payload must be a msgpack map, got {type(obj).__name__}")
    version = obj.get("schema")
    if version != SCHEMA_VERSION:
        raise CodecError(
            f"{kind} payload has schema version {version!r}; this build reads version {SCHEMA_VERSION}"
        )
    if obj.get("kind") != kind:
        raise CodecError(f"expected a {kind} payload, got kind {obj.get('kind')!r}")
    return obj, end


def _require(obj: dict[str, Any], key: str, types: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise CodecError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, types):
        names = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise CodecError(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


# -- trajectories and groups ------------------------------------------------------------------------------------


def _lengths(obj: dict[str, Any], key: str, n: int, where: str) -> list[int]:
    values = _require(obj, key, list, where)
    if len(values) != n or not all(isinstance(v, int) and v >= 0 for v in values):
        raise CodecError(f"{where}: {key} must be {n} non-negative ints, got {values!r}"[:300])
    return values


def encode_group(group: Group) -> bytes:
    trajectories = group.trajectories
    header = _pack(
        {
            "schema": SCHEMA_VERSION,
            "kind": "group",
            "group_id": group.group_id,
            "data_source": group.data_source,
            "index": int(group.index),
            "ground_truth": list(group.ground_truth),
            "question": group.question,
            "worker_id": group.worker_id,
            "created_at": float(group.created_at),
            "release_version": int(group.release_version),
            "n": len(trajectories),
            "prompt_lens": [len(t.prompt_ids) for t in trajectories],
            "response_lens": [len(t.response_ids) for t in trajectories],
            "rewards": [float(t.reward) for t in trajectories],
            "infos": [t.info for t in trajectories],
        }
    )
    arrays = [memoryview(getattr(t, name)).cast("B") for name in TRAJECTORY_ARRAYS for t in trajectories]
    size = sum(a.nbytes for a in arrays)
    return b"".join([header, b"\xc6", size.to_bytes(4, "big"), *arrays])  # bin32: the array bytes, one copy


def _blob(payload: bytes, start: int, where: str) -> memoryview:
    """The msgpack bin object that follows the header, as a view into the payload."""
    view = memoryview(payload)
    marker = view[start] if start < len(view) else None
    widths = {0xC4: 1, 0xC5: 2, 0xC6: 4}  # bin8, bin16, bin32
    if marker not in widths:
        raise CodecError(f"{where}: the header must be followed by a msgpack bin with the arrays")
    width = widths[marker]
    size = int.from_bytes(view[start + 1 : start + 1 + width], "big")
    begin = start + 1 + width
    if begin + size != len(view):
        raise CodecError(
            f"{where}: the array bin says {size} bytes but {len(view) - begin} follow the header"
        )
    return view[begin:]


def decode_group(payload: bytes, vocab_size: int | None = None) -> Group:
    """Decode and validate a group payload (the checks of `Group.validate`, vectorized over the group); with
    `vocab_size` (the model's embedding rows), token ids at or above it are refused too (`check_token_ids`)."""
    obj, end = _unpack(payload, "group", header_only=True)
    where = f"group {obj.get('group_id', '?')!r}"
    group_id = _require(obj, "group_id", str, where)
    if not group_id:
        raise CodecError("group_id is empty")
    n = _require(obj, "n", int, where)
    if n < 1:
        raise CodecError(f"{where}: has {n} trajectories; a group needs at least one")
    prompt_lens = _lengths(obj, "prompt_lens", n, where)
    response_lens = _lengths(obj, "response_lens", n, where)
    if min(prompt_lens) == 0:
        raise CodecError(f"{where}: trajectory {prompt_lens.index(0)} has empty prompt_ids")
    rewards = _require(obj, "rewards", list, where)
    infos = _require(obj, "infos", list, where)
    if len(rewards) != n or len(infos) != n:
        raise CodecError(f"{where}: {len(rewards)} rewards and {len(infos)} infos for {n} trajectories")
    if not all(isinstance(r, (int, float)) and math.isfinite(r) for r in rewards):
        raise CodecError(f"{where}: rewards must be finite numbers, got {rewards!r}"[:300])
    if not all(isinstance(i, dict) for i in infos):
        raise CodecError(f"{where}: every info must be a map")
    blob = _blob(payload, end, where)
    n_prompt, n_response = sum(prompt_lens), sum(response_lens)
    counts = {name: n_prompt if name == "prompt_ids" else n_response for name in TRAJECTORY_ARRAYS}
    expected = sum(counts[name] * dtype.itemsize for name, dtype in TRAJECTORY_ARRAYS.items())
    if len(blob) != expected:
        raise CodecError(
            f"{where}: the arrays take {len(blob)} bytes, expected {expected} for {n_prompt} prompt and "
            f"{n_response} response tokens"
        )
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for name, dtype in TRAJECTORY_ARRAYS.items():
        arrays[name] = np.frombuffer(blob, dtype=dtype, count=counts[name], offset=offset)
        offset += counts[name] * dtype.itemsize
    for name in ("prompt_ids", "response_ids"):
        if arrays[name].size and arrays[name].min() < 0:
            raise CodecError(f"{where}: {name} holds a negative token id ({int(arrays[name].min())})")
    mask, versions = arrays["loss_mask"], arrays["versions"]
    if mask.size:
        if mask.max() > 1:
            raise CodecError(f"{where}: loss_mask must contain only 0 and 1")
        # sampled tokens (mask 1) have a version >= 0; observation tokens (mask 0) have version -1
        if versions.min() < -1 or not np.array_equal(versions < 0, mask == 0):
            raise CodecError(f"{where}: versions must be -1 where loss_mask is 0 and >= 0 where it is 1")
        if not np.isfinite(arrays["behavior_logprobs"]).all():
            raise CodecError(f"{where}: behavior_logprobs contains NaN or inf")
    prompt_ends = list(itertools.accumulate(prompt_lens))
    response_ends = list(itertools.accumulate(response_lens))
    trajectories = []
    p0 = r0 = 0
    for i in range(n):
        p1, r1 = prompt_ends[i], response_ends[i]
        # fields set directly: the views already have the right dtype, are contiguous, and were checked above
        t = object.__new__(Trajectory)
        t.__dict__.update(
            prompt_ids=arrays["prompt_ids"][p0:p1],
            response_ids=arrays["response_ids"][r0:r1],
            loss_mask=mask[r0:r1],
            behavior_logprobs=arrays["behavior_logprobs"][r0:r1],
            versions=versions[r0:r1],
            reward=float(rewards[i]),
            info=infos[i],
        )
        trajectories.append(t)
        p0, r0 = p1, r1
    group = Group(
        group_id=group_id,
        data_source=_require(obj, "data_source", str, where),
        index=_require(obj, "index", int, where),
        ground_truth=_require(obj, "ground_truth", list, where),
        question=_require(obj, "question", str, where),
        worker_id=_require(obj, "worker_id", str, where),
        created_at=float(_require(obj, "created_at", (int, float), where)),
        release_version=_require(obj, "release_version", int, where),
        trajectories=trajectories,
    )
    if vocab_size is not None:
        check_token_ids(group, vocab_size)
    return group


def check_token_ids(group: Group, vocab_size: int) -> None:
    """CodecError naming the group, trajectory, field, position and id of the first token id outside the model's
    vocabulary ([0, vocab_size)): such an id would otherwise fail as an index error deep inside the embedding."""
    for i, trajectory in enumerate(group.trajectories):
        for name in ("prompt_ids", "response_ids"):
            ids = getattr(trajectory, name)
            bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
            if bad.size:
                at = int(bad[0])
                raise CodecError(
                    f"group {group.group_id!r} trajectory {i}: {name}[{at}] = {int(ids[at])} is outside the "
                    f"vocabulary of {vocab_size} tokens ({bad.size} such id(s))"
                )


# -- prompts ----------------------------------------------------------------------------------------------------


def encode_prompt(prompt: PromptRecord) -> bytes:
    return _pack({"schema": SCHEMA_VERSION, "kind": "prompt", **prompt.to_dict()})


def decode_prompt(payload: bytes) -> PromptRecord:
    obj, _ = _unpack(payload, "prompt")
    where = f"prompt {obj.get('group_id', '?')!r}"
    prompt = _require(obj, "prompt", list, where)
    for i, message in enumerate(prompt):
        if not (isinstance(message, dict) and isinstance(message.get("content"), str)):
            raise CodecError(f"{where}: prompt message {i} must be a map with a string 'content'")
    return PromptRecord(
        group_id=_require(obj, "group_id", str, where),
        question=_require(obj, "question", str, where),
        prompt=prompt,
        ground_truth=[str(a) for a in _require(obj, "ground_truth", list, where)],
        data_source=_require(obj, "data_source", str, where),
        index=_require(obj, "index", int, where),
        split=_require(obj, "split", str, where),
        release_version=_require(obj, "release_version", int, where),
    )
