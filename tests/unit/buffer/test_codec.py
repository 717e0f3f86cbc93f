"""The msgpack codec: exact round trips, and a clear CodecError for every kind of bad payload."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from buffer.codec import SCHEMA_VERSION, CodecError, decode_group, decode_prompt, encode_group, encode_prompt
from buffer.records import Group, Trajectory
from fakes.groups import make_group, make_prompt


def test_group_round_trip_is_exact():
    group = make_group(make_prompt(3, release_version=4), n=3, prompt_len=7, response_len=40, version=5)
    group.trajectories[1] = Trajectory(
        prompt_ids=np.arange(2),
        response_ids=np.array([], dtype=np.int32),
        loss_mask=[],
        behavior_logprobs=[],
        versions=[],
        reward=1.0,
        info={"em": 1.0, "answer": "x"},
    )
    back = decode_group(encode_group(group))
    assert (back.group_id, back.release_version, back.ground_truth) == (group.group_id, 4, group.ground_truth)
    for a, b in zip(group.trajectories, back.trajectories, strict=True):
        for name in ("prompt_ids", "response_ids", "loss_mask", "behavior_logprobs", "versions"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and np.array_equal(x, y), name
        assert (a.reward, a.info) == (b.reward, b.info)
    assert back.min_version() == 5


def test_prompt_round_trip():
    prompt = make_prompt(11, release_version=2)
    assert decode_prompt(encode_prompt(prompt)) == prompt


def small_group() -> Group:
    return make_group(make_prompt(0), n=2, prompt_len=3, response_len=10)


def split(payload: bytes) -> tuple[dict, bytes]:
    """The header map and the raw bytes after it (the bin with the arrays)."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(payload)
    header = unpacker.unpack()
    return header, payload[unpacker.tell() :]


def tamper_header(change) -> bytes:
    header, rest = split(encode_group(small_group()))
    change(header)
    return msgpack.packb(header, use_bin_type=True) + rest


def tamper_arrays(change) -> bytes:
    group = small_group()
    change(group.trajectories[1])
    return encode_group(group)


def test_payload_is_a_standard_msgpack_stream():
    header, rest = split(encode_group(small_group()))
    blob = msgpack.unpackb(rest)
    assert header["n"] == 2 and len(blob) == 2 * (3 * 4) + 2 * 10 * (4 + 1 + 4 + 4)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1, 2]), "must be a msgpack map"),
        (tamper_header(lambda h: h.update(schema=SCHEMA_VERSION + 1)), "schema version"),
        (tamper_header(lambda h: h.update(kind="prompt")), "expected a group payload"),
        (tamper_header(lambda h: h.pop("release_version")), "missing field 'release_version'"),
        (tamper_header(lambda h: h.update(response_lens=[10])), "response_lens must be 2"),
        (tamper_header(lambda h: h.update(response_lens=[10, 11])), "the array bin says|arrays take"),
        (tamper_header(lambda h: h.update(n=0)), "at least one"),
        (tamper_header(lambda h: h.update(rewards=[0.0, float("nan")])), "finite"),
        (tamper_header(lambda h: h.update(prompt_lens=[0, 6])), "empty prompt_ids"),
        (tamper_header(lambda h: h.update(group_id="")), "group_id is empty"),
        (encode_group(small_group())[:-3], "the array bin says"),
        (
            msgpack.packb(split(encode_group(small_group()))[0], use_bin_type=True),
            "followed by a msgpack bin",
        ),
        (tamper_arrays(lambda t: t.loss_mask.__setitem__(4, 2)), "only 0 and 1"),
        (tamper_arrays(lambda t: t.versions.__setitem__(4, -1)), "versions must be -1"),
        (tamper_arrays(lambda t: t.behavior_logprobs.__setitem__(4, np.inf)), "NaN or inf"),
    ],
)
def test_bad_group_payloads_raise_codec_error(payload, message):
    with pytest.raises(CodecError, match=message):
        decode_group(payload)


def test_bad_prompt_payload_raises_codec_error():
    obj = msgpack.unpackb(encode_prompt(make_prompt(0)), raw=False)
    obj["prompt"] = [{"role": "user"}]
    with pytest.raises(CodecError, match="string 'content'"):
        decode_prompt(msgpack.packb(obj, use_bin_type=True))


def test_token_ids_outside_the_vocabulary_are_named():
    group = make_group(make_prompt(3), n=2, prompt_len=5, response_len=6)
    vocab = int(max(max(t.prompt_ids.max(), t.response_ids.max()) for t in group.trajectories)) + 1
    assert decode_group(encode_group(group), vocab_size=vocab).group_id == group.group_id
    group.trajectories[1].response_ids[4] = vocab + 7  # a sampled id the model has no embedding for
    payload = encode_group(group)
    assert decode_group(payload).group_id == group.group_id  # without a vocabulary, only the shape is checked
    with pytest.raises(
        CodecError, match=rf"trajectory 1: response_ids\[4\] = {vocab + 7} is outside the vocabulary"
    ):
        decode_group(payload, vocab_size=vocab)


def test_a_negative_token_id_is_refused():
    group = make_group(make_prompt(3), n=1, prompt_len=5, response_len=6)
    group.trajectories[0].prompt_ids[2] = -4
    with pytest.raises(CodecError, match="prompt_ids holds a negative token id"):
        decode_group(encode_group(group))
