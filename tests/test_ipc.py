"""The supervisor <-> step child protocol: codec, validation, and real pipes between processes."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import ipc
import ipc.stream
from flower.state.result import StepResult
from ipc import (
    MAX_LINE_BYTES,
    Answer,
    Ask,
    EventMsg,
    Failure,
    Hello,
    Interrupt,
    Kept,
    LineReader,
    LineWriter,
    Message,
    ProtocolError,
    Result,
    Session,
    Shutdown,
    Start,
    decode,
    encode,
    read_messages,
)

SAMPLES: list[Message] = [
    Start(
        label="plan#retry1",
        step="plan",
        prompt="写一个计划\nsecond line\u2028",
        spec="planner",
        resume="sid-1",
        fork=True,
        resume_at="uuid-9",
        attempt=2,
        stop_at=150_000,
    ),
    Start("build", "build", "go", "coder"),
    Interrupt(),
    Answer("q1", "answered", "yes"),
    Answer("q2", "timeout", None),
    Answer("q3", "closed"),
    Shutdown("killed-by-signal"),
    Kept("0b8e6b1e-2c1f-4c64-9d8e-5d2b7f0a1c3e"),
    Hello(4242),
    Session("plan", "plan", "0b8e6b1e-2c1f-4c64-9d8e-5d2b7f0a1c3e"),
    EventMsg("retry", "plan", {"attempt": 2, "delay": 4.25, "error": "overloaded"}),
    EventMsg("handoff", "plan", {}),
    Ask("q1", "Continue with the plan?", ["yes", "no"], "choice"),
    Ask("q2", "Anything to add?", [], "text"),
    Result(StepResult(step="plan", ok=True, text="done", errors=["429"], retired=["s0"]).to_dict()),
    Failure("ImportError", "no module named x", False, "Traceback ..."),
    Failure("APIError", "overloaded", True),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg: Message) -> None:
    line = encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line) == msg
    assert decode(line.decode("utf-8")) == msg  # str input, too
    assert decode(line[:-1]) == msg  # the newline is optional for decode


def test_every_wire_type_has_a_sample() -> None:
    assert {m.TYPE for m in SAMPLES} == set(ipc.MESSAGE_TYPES)
    assert set(ipc.MESSAGE_TYPES) == {
        "start",
        "interrupt",
        "answer",
        "shutdown",
        "kept",
        "hello",
        "session",
        "event",
        "ask",
        "result",
        "failure",
    }


def test_line_layout_is_versioned_compact_utf8() -> None:
    line = encode(Shutdown("é\n"))
    assert line == '{"v":1,"type":"shutdown","reason":"é\\n"}\n'.encode()
    assert json.loads(encode(SAMPLES[0]))["v"] == ipc.PROTOCOL_VERSION == 1


def test_result_carries_a_step_result() -> None:
    original = StepResult(
        step="s",
        session_id="x",
        ok=True,
        cost_usd=0.5,
        num_turns=3,
        text="t" * 1000,
        errors=["e"],
        context=12345,
    )
    decoded = decode(encode(Result(original.to_dict())))
    assert isinstance(decoded, Result)
    assert StepResult.from_dict(decoded.fields) == original


def test_messages_are_frozen_and_slotted() -> None:
    msg = Hello(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.pid = 2  # type: ignore[misc]
    assert not hasattr(msg, "__dict__")


def _line(**obj: object) -> bytes:
    return json.dumps(obj).encode()


HELLO = {"v": 1, "type": "hello", "pid": 1}

MALFORMED: list[tuple[str, bytes | str, str]] = [
    ("bad json", b'{"v":1,', "bad JSON"),
    ("not an object", b"[1, 2]", "not a JSON object: array"),
    ("a bare string", b'"hello"', "not a JSON object: string"),
    ("empty", b"", "empty line"),
    ("blank", b"  \t ", "empty line"),
    ("two lines", _line(**HELLO) + b"\n" + _line(**HELLO), "more than one line"),
    ("missing version", _line(type="hello", pid=1), "missing protocol version"),
    ("wrong version", _line(**{**HELLO, "v": 2}), "unsupported protocol version 2"),
    ("version true", _line(**{**HELLO, "v": True}), "unsupported protocol version True"),
    ("version float", _line(**{**HELLO, "v": 1.0}), "unsupported protocol version 1.0"),
    ("missing type", _line(v=1, pid=1), "missing message 'type'"),
    ("type not str", _line(v=1, type=3), "'type' must be a string, got integer"),
    ("unknown type", _line(v=1, type="launch"), "unknown message type 'launch'"),
    (
        "missing field",
        _line(v=1, type="session", label="a", step="b"),
        "session: missing field 'session_id'",
    ),
    ("extra field", _line(**HELLO, ppid=2), "hello: unexpected field 'ppid'"),
    ("str as int", _line(**{**HELLO, "pid": "1"}), "'pid' must be an integer, got string"),
    ("bool as int", _line(**{**HELLO, "pid": True}), "'pid' must be an integer, got boolean"),
    ("float as int", _line(**{**HELLO, "pid": 1.5}), "'pid' must be an integer, got number"),
    ("int as str", _line(v=1, type="shutdown", reason=3), "'reason' must be a string, got integer"),
    (
        "null as str",
        _line(v=1, type="shutdown", reason=None),
        "'reason' must be a string, got null",
    ),
    (
        "int as bool",
        _line(v=1, type="failure", kind="k", message="m", retryable=1, cause=None),
        "'retryable' must be true or false",
    ),
    (
        "list with int",
        _line(v=1, type="ask", id="q", question="?", options=["a", 1], kind="k", channel=""),
        "'options' must be a list of strings",
    ),
    (
        "list as dict",
        _line(v=1, type="event", kind="k", step="s", payload=[], text="", tool=""),
        "'payload' must be a JSON object, got array",
    ),
    (
        "bad answer state",
        _line(v=1, type="answer", id="q", state="maybe", text=None),
        "'state' must be one of answered, closed, timeout",
    ),
    (
        "result without step",
        _line(v=1, type="result", fields={"ok": True}),
        "fields must hold a string 'step'",
    ),
    (
        "result step not str",
        _line(v=1, type="result", fields={"step": 1}),
        "fields must hold a string 'step'",
    ),
    ("duplicate key", b'{"v":1,"type":"hello","pid":1,"pid":2}', "duplicate key 'pid'"),
    (
        "NaN",
        b'{"v":1,"type":"event","kind":"k","step":"s","payload":{"x":NaN}}',
        "NaN is not a JSON number",
    ),
    ("Infinity", b'{"v":1,"type":"hello","pid":Infinity}', "Infinity is not a JSON number"),
    ("invalid utf-8", b'{"v":1,"type":"shutdown","reason":"\xff\xfe"}', "invalid UTF-8 at byte 35"),
    ("utf-8 bom", b'\xef\xbb\xbf{"v":1,"type":"hello","pid":1}', "bad JSON"),
    ("escaped lone surrogate", b'{"v":1,"type":"shutdown","reason":"\\udc80"}', "lone surrogate"),
    ("str with lone surrogate", '{"v":1,"type":"shutdown","reason":"\udc80"}', "lone surrogate"),
    ("too deep", b"[" * 100_000, "nested too deeply"),
    (
        "too deep in a field",
        b'{"v":1,"type":"event","kind":"k","step":"s","text":"","tool":"","payload":{"a":'
        + b"[" * 80
        + b"]" * 80
        + b"}}",
        "nested deeper than 64",
    ),
    ("huge integer", b'{"v":1,"type":"hello","pid":' + b"9" * 5000 + b"}", "number too long"),
]


@pytest.mark.parametrize(
    ("line", "reason"),
    [(line, r) for _, line, r in MALFORMED],
    ids=[name for name, _, _ in MALFORMED],
)
def test_malformed_lines_give_a_protocol_error_with_a_reason(
    line: bytes | str, reason: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(line)
    assert reason in info.value.reason
    assert len(info.value.excerpt) <= ipc.EXCERPT_BYTES
    assert reason in str(info.value)


def test_oversized_line_error_is_short() -> None:
    line = encode(Result({"step": "s", "text": "x" * 5000}))
    with pytest.raises(ProtocolError, match="exceeds the bound of 1000") as info:
        decode(line, max_line_bytes=1000)
    assert info.value.excerpt == line[: ipc.EXCERPT_BYTES]
    assert len(str(info.value)) < 400


def test_protocol_error_is_a_value_error_and_pickles() -> None:
    err = ProtocolError("bad JSON", b"x" * 1000)
    assert isinstance(err, ValueError)
    back = pickle.loads(pickle.dumps(err))
    assert (back.reason, back.excerpt, str(back)) == (err.reason, err.excerpt, str(err))


def test_invalid_messages_cannot_be_built() -> None:
    with pytest.raises(ProtocolError, match="'pid' must be an integer, got string"):
        Hello("12")  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="a set is not a JSON value"):
        EventMsg("k", "s", {"x": {1, 2}})
    with pytest.raises(ProtocolError, match="object key 1 is not a string"):
        EventMsg("k", "s", {1: "x"})  # type: ignore[dict-item]
    with pytest.raises(ProtocolError, match="inf is not a JSON number"):
        EventMsg("k", "s", {"x": float("inf")})
    with pytest.raises(ProtocolError, match="'state' must be one of"):
        Answer("q", "later")


def test_encode_rechecks_a_mutated_dict_and_the_bound() -> None:
    msg = EventMsg("k", "s", {})
    msg.payload["when"] = object()
    with pytest.raises(ProtocolError, match="object is not a JSON value"):
        encode(msg)
    with pytest.raises(ProtocolError, match="exceeds the bound of 100"):
        encode(Shutdown("x" * 200), max_line_bytes=100)
    assert decode(encode(Shutdown("x" * 50), max_line_bytes=100)) == Shutdown("x" * 50)
    with pytest.raises(ProtocolError, match="not a protocol message"):
        encode({"v": 1, "type": "hello", "pid": 1})  # type: ignore[arg-type]


def test_default_bound_takes_a_large_final_text() -> None:
    assert MAX_LINE_BYTES == 8 * 1024 * 1024
    msg = Result({"step": "s", "text": "字" * (2 * 1024 * 1024)})  # 6 MiB of UTF-8
    assert decode(encode(msg)) == msg


# --- LineReader ------------------------------------------------------------------------------


def test_reader_reassembles_lines_across_chunks() -> None:
    stream = b"".join(encode(m) for m in SAMPLES)
    reader = LineReader()
    got: list[Message | ProtocolError] = []
    for i in range(0, len(stream), 7):
        got += reader.feed(stream[i : i + 7])
    assert got == SAMPLES
    assert reader.eof() == [] and reader.buffered == 0


def test_reader_reports_a_bad_line_and_goes_on() -> None:
    reader = LineReader()
    items = reader.feed(encode(Hello(1)) + b"{oops\n" + b'{"v":9}\n' + encode(Hello(2)))
    assert items[0] == Hello(1) and items[3] == Hello(2)
    assert isinstance(items[1], ProtocolError) and "bad JSON" in items[1].reason
    assert isinstance(items[2], ProtocolError) and "version 9" in items[2].reason


def test_reader_reports_an_oversized_line_once_without_buffering_it() -> None:
    reader = LineReader(max_line_bytes=100)
    items = reader.feed(encode(Hello(1)) + b"y" * 60)
    assert items == [Hello(1)]
    items = reader.feed(b"y" * 60)
    assert len(items) == 1 and "longer than the bound of 100" in items[0].reason
    assert items[0].excerpt.startswith(b"y" * 60)
    for _ in range(1000):  # 1 MB more of the same line: nothing reported, nothing held
        assert reader.feed(b"z" * 1000) == []
        assert reader.buffered == 0
    assert reader.feed(b"zz\n" + encode(Hello(2))) == [Hello(2)]


def test_reader_accepts_a_line_exactly_at_the_bound() -> None:
    line = encode(Shutdown("x" * 80))
    reader = LineReader(max_line_bytes=len(line) - 1)
    assert reader.feed(line) == [Shutdown("x" * 80)]
    assert isinstance(LineReader(len(line) - 2).feed(line)[0], ProtocolError)


def test_reader_reports_a_truncated_last_line_at_eof() -> None:
    reader = LineReader()
    assert reader.feed(encode(Hello(1)) + encode(Hello(2))[:9]) == [Hello(1)]
    (err,) = reader.eof()
    assert isinstance(err, ProtocolError)
    assert err.reason == "truncated line at end of stream (9 bytes, no newline)"
    assert err.excerpt == b'{"v":1,"t'
    assert reader.eof() == []


def test_reader_rejects_a_non_positive_bound() -> None:
    with pytest.raises(ValueError):
        LineReader(0)


# --- read_messages --------------------------------------------------------------------------


def test_read_messages_from_a_binary_file() -> None:
    stream = io.BytesIO(b"".join(encode(m) for m in SAMPLES))
    assert list(read_messages(stream)) == SAMPLES


def test_read_messages_raises_at_the_first_bad_line() -> None:
    it = read_messages(io.BytesIO(encode(Hello(1)) + b"nope\n" + encode(Hello(2))))
    assert next(it) == Hello(1)
    with pytest.raises(ProtocolError, match="bad JSON"):
        next(it)


def test_read_messages_raises_on_a_truncated_tail() -> None:
    with pytest.raises(ProtocolError, match="truncated line"):
        list(read_messages(io.BytesIO(encode(Hello(1)) + b'{"v":1')))


# --- real pipes -----------------------------------------------------------------------------


@pytest.fixture
def pipe() -> Iterator[Callable[[], tuple[int, int]]]:
    """Makes pipes and closes whatever ends are still open at teardown."""
    fds: list[int] = []

    def make() -> tuple[int, int]:
        r, w = os.pipe()
        fds.extend((r, w))
        return r, w

    yield make
    for fd in fds:
        with contextlib.suppress(OSError):  # the test closed it already
            os.close(fd)


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Starts ``python -c script`` children with the given fds, and reaps every one."""
    children: list[subprocess.Popen[bytes]] = []

    def start(script: str, *fds: int) -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, "-c", script, *map(str, fds)], pass_fds=fds)
        children.append(child)
        for fd in fds:  # the child holds these now; the parent must not keep pipes half open
            os.close(fd)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)


def pump(
    fd: int, reader: LineReader, until: Callable[[list], bool], timeout: float = 10.0
) -> list[Message | ProtocolError]:
    """Feed ``reader`` from ``fd`` until ``until(items)`` holds or EOF; fails after ``timeout``."""
    items: list[Message | ProtocolError] = []
    deadline = time.monotonic() + timeout
    while not until(items):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out; got {items!r}"
        if not select.select([fd], [], [], remaining)[0]:
            continue
        data = os.read(fd, 65536)
        if not data:
            return items + reader.eof()
        items += reader.feed(data)
    return items


ECHO_CHILD = """
import os, sys
from ipc import EventMsg, Hello, LineWriter, Result, Session, Shutdown, Start, read_messages
rfd, wfd = int(sys.argv[1]), int(sys.argv[2])
out = LineWriter(wfd)
out.send(Hello(os.getpid()))
for msg in read_messages(rfd):
    if isinstance(msg, Start):
        out.send(Session(msg.label, msg.step, "sid-" + msg.label))
        out.send(EventMsg("text", msg.step, {"chars": len(msg.prompt)}))
        out.send(Result({"step": msg.step, "ok": True, "text": msg.prompt[::-1]}))
    elif isinstance(msg, Shutdown):
        sys.exit(0)
sys.exit(3)
"""


def test_parent_and_child_talk_over_pipes_with_lines_bigger_than_the_pipe(
    pipe: Callable[[], tuple[int, int]],
    spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    to_child_r, to_child_w = pipe()
    from_child_r, from_child_w = pipe()
    child = spawn(ECHO_CHILD, to_child_r, from_child_w)
    os.set_blocking(to_child_w, False)
    os.set_blocking(from_child_r, False)
    reader, writer = LineReader(), LineWriter(to_child_w)

    (hello,) = pump(from_child_r, reader, lambda items: len(items) >= 1)
    assert hello == Hello(child.pid)
    prompt = "说" * 100_000 + "end"  # 300 KB of UTF-8: several pipe buffers
    writer.send(Start("plan", "plan", prompt, "planner", stop_at=150_000))
    items = pump(from_child_r, reader, lambda items: len(items) >= 3)
    assert items == [
        Session("plan", "plan", "sid-plan"),
        EventMsg("text", "plan", {"chars": len(prompt)}),
        Result({"step": "plan", "ok": True, "text": prompt[::-1]}),
    ]
    writer.send(Shutdown("done"))
    assert pump(from_child_r, reader, lambda items: False) == []  # clean EOF, no partial line
    assert child.wait(timeout=10) == 0


BIG_WRITER_CHILD = """
import os, sys
from ipc import Hello, LineWriter, Result
out = LineWriter(int(sys.argv[1]))
out.send(Hello(os.getpid()))
out.send(Result({"step": "s", "text": "x" * (4 * 1024 * 1024)}))
sys.exit(0)
"""


def test_writer_killed_mid_line_gives_a_truncated_line_error(
    pipe: Callable[[], tuple[int, int]],
    spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    r, w = pipe()
    child = spawn(BIG_WRITER_CHILD, w)
    reader = LineReader()
    assert pump(r, reader, lambda items: len(items) >= 1) == [Hello(child.pid)]
    # Take a first piece of the 4 MB line and stop reading: the child is now blocked inside
    # send(), since a pipe holds at most 1 MB (/proc/sys/fs/pipe-max-size) of the rest.
    pump(r, reader, lambda items: reader.buffered > 0)
    child.kill()
    assert child.wait(timeout=10) == -signal.SIGKILL
    (err,) = pump(r, reader, lambda items: False)
    assert isinstance(err, ProtocolError)
    assert err.reason.startswith("truncated line at end of stream")
    assert err.excerpt.startswith(b'{"v":1,"type":"result"')


SHORT_READER_CHILD = """
import os, sys
os.read(int(sys.argv[1]), 10)
"""


def test_send_raises_broken_pipe_when_the_reader_is_gone(
    pipe: Callable[[], tuple[int, int]],
    spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    r, w = pipe()
    child = spawn(SHORT_READER_CHILD, r)  # reads 10 bytes, exits: the read end closes
    os.set_blocking(w, False)
    with pytest.raises(BrokenPipeError):
        LineWriter(w).send(Shutdown("x" * (2 * 1024 * 1024)))
    assert child.wait(timeout=10) == 0
    r2, w2 = pipe()
    os.close(r2)
    with pytest.raises(BrokenPipeError):
        LineWriter(w2).send(Hello(1))  # blocking descriptor, reader closed before the send


def test_send_on_a_non_blocking_fd_waits_for_the_reader(
    pipe: Callable[[], tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r, w = pipe()
    os.set_blocking(w, False)
    waiting = threading.Event()
    real_wait = ipc.stream._wait

    def wait(fd: int, events: int) -> None:
        waiting.set()
        real_wait(fd, events)

    monkeypatch.setattr(ipc.stream, "_wait", wait)
    msg = Shutdown("x" * (1024 * 1024))  # more than any pipe holds: EAGAIN is certain
    thread = threading.Thread(target=LineWriter(w).send, args=(msg,))
    thread.start()
    assert waiting.wait(timeout=10)  # the writer met EAGAIN and is polling
    it = read_messages(r)
    assert next(it) == msg
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_read_messages_waits_on_a_non_blocking_fd(
    pipe: Callable[[], tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r, w = pipe()
    os.set_blocking(r, False)
    waiting = threading.Event()
    real_wait = ipc.stream._wait

    def wait(fd: int, events: int) -> None:
        waiting.set()
        real_wait(fd, events)

    monkeypatch.setattr(ipc.stream, "_wait", wait)
    got: list[Message] = []
    thread = threading.Thread(target=lambda: got.extend(read_messages(r)))
    thread.start()
    assert waiting.wait(timeout=10)  # the reader met EAGAIN and is polling
    os.write(w, encode(Hello(1)) + encode(Hello(2)))
    os.close(w)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert got == [Hello(1), Hello(2)]


def test_concurrent_sends_never_interleave(pipe: Callable[[], tuple[int, int]]) -> None:
    r, w = pipe()
    writer = LineWriter(w)
    texts = {f"t{n}-{i}": chr(0x4E00 + n) * 50_000 for n in range(4) for i in range(10)}

    def send_all(n: int) -> None:
        try:
            for i in range(10):
                writer.send(Shutdown(f"t{n}-{i}:" + texts[f"t{n}-{i}"]))
        except BrokenPipeError:
            pass  # the reader gave up on a garbled stream; its assertion tells why

    threads = [threading.Thread(target=send_all, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        got = list(_read_n(r, 40))
    finally:
        os.close(r)  # unblocks any sender still waiting on a full pipe
        for thread in threads:
            thread.join(timeout=10)
    assert sorted(m.reason for m in got) == sorted(f"{k}:{v}" for k, v in texts.items())


def _read_n(fd: int, n: int) -> Iterator[Message]:
    it = read_messages(fd)
    for _ in range(n):
        yield next(it)
