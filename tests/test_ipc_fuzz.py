"""Property tests: whatever bytes arrive, the pipe reader answers with messages or ProtocolError.

Nothing else may escape (the supervisor must never crash on a child's output), the result must not
depend on how the stream was chunked, and memory must stay under the line bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipc import (
    ANSWER_STATES,
    MESSAGE_TYPES,
    Answer,
    LineReader,
    Message,
    ProtocolError,
    Result,
    decode,
    encode,
)

# Each property is bounded twice: per example by hypothesis' deadline, per test by pytest-timeout.
pytestmark = pytest.mark.timeout(30)
FUZZ = settings(max_examples=150, deadline=1000, suppress_health_check=[HealthCheck.too_slow])

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)

# By annotation: values of the right JSON type, and a predicate for "wrong type" (written here
# independently of ipc's own table, so the two can disagree and fail).
RIGHT: dict[str, st.SearchStrategy[Any]] = {
    "str": st.text(max_size=30),
    "str | None": st.none() | st.text(max_size=30),
    "int": st.integers(),
    "int | None": st.none() | st.integers(),
    "bool": st.booleans(),
    "list[str]": st.lists(st.text(max_size=10), max_size=4),
    "dict[str, Any]": json_objects,
}
WRONG = {
    "str": lambda v: not isinstance(v, str),
    "str | None": lambda v: v is not None and not isinstance(v, str),
    "int": lambda v: isinstance(v, bool) or not isinstance(v, int),
    "int | None": lambda v: v is not None and (isinstance(v, bool) or not isinstance(v, int)),
    "bool": lambda v: not isinstance(v, bool),
    "list[str]": lambda v: not (isinstance(v, list) and all(isinstance(i, str) for i in v)),
    "dict[str, Any]": lambda v: not isinstance(v, dict),
}


def message_strategy(cls: type[Message]) -> st.SearchStrategy[Message]:
    kwargs = {f.name: RIGHT[str(f.type)] for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if cls is Answer:
        kwargs["state"] = st.sampled_from(sorted(ANSWER_STATES))
    if cls is Result:
        kwargs["fields"] = st.builds(
            lambda step, rest: {**rest, "step": step}, st.text(max_size=10), json_objects
        )
    return st.builds(cls, **kwargs)


messages = st.one_of([message_strategy(cls) for cls in MESSAGE_TYPES.values()])


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def read_all(chunks: list[bytes], bound: int = 1 << 20) -> list[Message | ProtocolError]:
    reader = LineReader(max_line_bytes=bound)
    items: list[Message | ProtocolError] = []
    for chunk in chunks:
        items += reader.feed(chunk)
        assert reader.buffered <= bound
    return items + reader.eof()


def kinds(items: list[Message | ProtocolError]) -> list[Message | type]:
    """Messages as they are, errors by type (their excerpts depend on where a chunk ended)."""
    return [ProtocolError if isinstance(item, ProtocolError) else item for item in items]


@FUZZ
@given(st.binary(max_size=2000))
def test_decode_of_any_bytes_is_a_message_or_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        assert isinstance(decode(data), Message)


@FUZZ
@given(st.text(max_size=500))
def test_decode_of_any_text_is_a_message_or_protocol_error(text: str) -> None:
    with contextlib.suppress(ProtocolError):
        assert isinstance(decode(text), Message)


@FUZZ
@given(
    st.binary(max_size=3000),
    st.lists(st.integers(min_value=0), max_size=20),
    st.sampled_from([16, 100, 1 << 20]),
)
def test_reader_of_any_bytes_yields_only_messages_and_errors(
    data: bytes, cuts: list[int], bound: int
) -> None:
    for item in read_all(split(data, cuts), bound):
        assert isinstance(item, (Message, ProtocolError))


@FUZZ
@given(messages)
def test_every_valid_message_round_trips(msg: Message) -> None:
    assert decode(encode(msg)) == msg


@FUZZ
@given(st.lists(messages, max_size=8), st.lists(st.integers(min_value=0), max_size=30))
def test_chunk_boundaries_do_not_change_the_messages(msgs: list[Message], cuts: list[int]) -> None:
    stream = b"".join(encode(m) for m in msgs)
    assert read_all(split(stream, cuts)) == msgs
    assert read_all([bytes([b]) for b in stream[:3000]] + [stream[3000:]]) == msgs


@FUZZ
@given(st.lists(messages, min_size=1, max_size=6), st.integers(min_value=0))
def test_a_truncated_stream_yields_the_whole_lines_then_one_error(
    msgs: list[Message], cut: int
) -> None:
    lines = [encode(m) for m in msgs]
    stream = b"".join(lines)
    cut %= len(stream)
    items = read_all([stream[:cut]])
    complete = stream[:cut].count(b"\n")
    assert items[:complete] == msgs[:complete]
    at_boundary = cut == 0 or stream[cut - 1 : cut] == b"\n"
    assert kinds(items[complete:]) == ([] if at_boundary else [ProtocolError])


@FUZZ
@given(messages, st.data())
def test_a_wrong_json_type_in_any_field_is_a_protocol_error(
    msg: Message, data: st.DataObject
) -> None:
    fields = dataclasses.fields(msg)
    if not fields:
        return
    target = data.draw(st.sampled_from(fields))
    wrong = data.draw(json_values.filter(WRONG[str(target.type)]))
    obj = json.loads(encode(msg))
    obj[target.name] = wrong
    with pytest.raises(ProtocolError) as info:
        decode(json.dumps(obj))
    assert repr(target.name) in info.value.reason


@FUZZ
@given(messages, st.data())
def test_a_missing_or_extra_field_is_a_protocol_error(msg: Message, data: st.DataObject) -> None:
    obj = json.loads(encode(msg))
    own = sorted(set(obj) - {"v", "type"})  # none for ``interrupt``: only an extra one then
    if own and data.draw(st.booleans()):
        name = data.draw(st.sampled_from(own))
        del obj[name]
        expected = "missing"
    else:
        name = data.draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in obj))
        obj[name] = data.draw(json_values)
        expected = "unexpected"
    with pytest.raises(ProtocolError, match=expected):
        decode(json.dumps(obj, ensure_ascii=False))


@FUZZ
@given(
    st.lists(
        messages.map(encode)
        | st.binary(min_size=200, max_size=2000).map(lambda b: b.replace(b"\n", b"") + b"\n")
        | st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"") + b"\n"),
        max_size=10,
    ),
    st.lists(st.integers(min_value=0), max_size=30),
)
def test_huge_lines_are_reported_once_and_never_buffered(
    lines: list[bytes], cuts: list[int]
) -> None:
    bound = 128
    expected: list[Message | type] = []
    for line in lines:
        if len(line) - 1 > bound:
            expected.append(ProtocolError)
        else:
            try:
                expected.append(decode(line, bound))
            except ProtocolError:
                expected.append(ProtocolError)
    assert kinds(read_all(split(b"".join(lines), cuts), bound)) == expected


@FUZZ
@given(
    messages,
    st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=5),
)
def test_corrupted_valid_lines_never_raise_anything_else(
    msg: Message, edits: list[tuple[int, int]]
) -> None:
    line = bytearray(encode(msg))
    for pos, byte in edits:
        line[pos % len(line)] = byte
    with contextlib.suppress(ProtocolError):
        decode(bytes(line))
    for item in read_all([bytes(line)]):
        assert isinstance(item, (Message, ProtocolError))


@FUZZ
@given(st.sampled_from(list(MESSAGE_TYPES.values())), st.data())
def test_building_from_arbitrary_values_either_fails_cleanly_or_round_trips(
    cls: type[Message], data: st.DataObject
) -> None:
    odd = json_values | st.sampled_from([{1, 2}, (1, 2), b"x", float("nan"), {1: "x"}, "\udc80"])
    kwargs = {f.name: data.draw(odd) for f in dataclasses.fields(cls)}
    try:
        msg = cls(**kwargs)
    except ProtocolError:
        return
    assert decode(encode(msg)) == msg


@FUZZ
@given(
    st.one_of(st.just(1), json_values),
    st.one_of(st.sampled_from(sorted(MESSAGE_TYPES)), json_values),
    json_objects,
)
def test_any_envelope_is_a_message_or_protocol_error(version: Any, name: Any, rest: dict) -> None:
    line = json.dumps({**rest, "v": version, "type": name}, ensure_ascii=False)
    try:
        msg = decode(line)
    except ProtocolError:
        return
    assert (msg.TYPE, version) == (name, 1)
