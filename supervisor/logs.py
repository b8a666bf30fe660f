"""``flower-super logs [-f] [RUN]``: a run's events, one readable line each.

It prints ``<run_dir>/logs/<run id>/events.jsonl`` (written by that run's supervisor, see
:mod:`supervisor.eventlog`) as ``HH:MM:SS  step  kind  text``, every text cleaned of escape
sequences (:func:`flower.util.sanitize.clean`) and cut to one line; a line names the date
whenever it changes. RUN is a run id or a unique prefix, as ``cancel`` takes it (the
registry resolves it); nothing means the latest run.

``-f`` keeps reading while that flower is live (its record says running and its process,
checked by pid and start time, still exists), polling every :data:`POLL_S` seconds; once it
is gone the rest of the file is printed and the command ends (exit 0). Ctrl-C ends it
quietly (exit 130). A run from before the event log existed has no file: one line says so
(exit 1).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from flower import FlowerError
from flower.i18n import define, t
from flower.state.eventlog import events_path
from flower.state.registry import RUNNING, FlowerRecord, Registry, state_of
from flower.util.sanitize import clean
from supervisor.cancel import find_run
from supervisor.columns import terminal_columns
from supervisor.columns import width as cols
from supervisor.out import echo, one_line

POLL_S = 0.2  # a person watching does not notice 0.2 s; reading a record costs ~50 us
PIPED_CHARS = 400  # a line's text when stdout is not a terminal (grep wants more than 80)
# Payload keys that never help on one line (ids, whole tool inputs, the step itself).
QUIET_KEYS = {
    "step",
    "subagent",
    "id",
    "tool_use_id",
    "parent_tool_use_id",
    "input",
    "is_error",
    "session_id",
    "type",
}
# Kinds whose text says it all (a system message's payload is the CLI's whole init record).
PLAIN_KINDS = {"text", "prompt", "thinking", "system", "error"}

define(
    {
        "logs.header": ("-- run {run} · {flow} · {state}", "-- run {run} · {flow} · {state}"),
        "logs.date": ("-- {date}", "-- {date}"),
        "logs.none": (
            "run {run} 没有事件日志({path} 不存在:这次运行早于事件日志,或还没开始)",
            "run {run} has no event log ({path} does not exist: the run predates event"
            " logs, or has not begun)",
        ),
        "logs.ended": ("-- 这个 flower 已结束({state})", "-- that flower has ended ({state})"),
        "logs.following": (
            "-- 跟随中,flower 结束时停止(Ctrl-C 退出)",
            "-- following until the flower ends (Ctrl-C to stop)",
        ),
        "logs.read_failed": ("{path} 读不了:{why}", "{path} cannot be read: {why}"),
        "logs.unreadable": ("? 读不了的一行:{line}", "? unreadable line: {line}"),
        "logs.no_runs": ("{run_dir} 里还什么都没跑过", "nothing has run in {run_dir} yet"),
        "logs.no_runs.hint": (
            "在启动 flower 的目录里运行,或用 -r 指定运行目录",
            "run this where you started flower, or pass -r RUN_DIR",
        ),
    }
)


def pick_run(run_dir: Path, run: str | None) -> FlowerRecord:
    """The record ``run`` names (cancel's resolution), or the latest run's."""
    if run is not None:
        return find_run(run_dir, run)
    records = Registry(run_dir).records()
    if not records:
        raise FlowerError(t("logs.no_runs", run_dir=run_dir), hint=t("logs.no_runs.hint"))
    return records[-1]


def is_live(run_dir: Path, run: str) -> bool:
    """Is the flower of ``run`` still running (as status and cancel judge it)?"""
    record = Registry(run_dir).get(run)
    return record is not None and record.state == RUNNING and record.alive


# -- reading ---------------------------------------------------------------------------


def read_lines(f: IO[bytes], buf: bytearray) -> Iterator[bytes]:
    """The whole lines that can be read from ``f`` now; a line still being written stays in
    ``buf`` until its newline arrives."""
    while True:
        chunk = f.read(65536)
        if not chunk:
            return
        buf.extend(chunk)
        while True:
            cut = buf.find(b"\n")
            if cut < 0:
                break
            line = bytes(buf[:cut])
            del buf[: cut + 1]
            if line.strip():
                yield line


def follow(
    path: Path,
    emit: Callable[[bytes], None],
    live: Callable[[], bool],
    *,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Every line of ``path`` to ``emit``, then new ones as they come while ``live()``;
    after it turns false, the rest of the file, then return."""
    buf = bytearray()
    with open(path, "rb") as f:
        while True:
            going = live()  # asked before reading: what was written before it ended is read
            for line in read_lines(f, buf):
                emit(line)
            if not going:
                return
            sleep(poll_s)


# -- one line --------------------------------------------------------------------------


class Lines:
    """Renders event lines, with a date line whenever the day changes."""

    def __init__(self, width: int | None) -> None:
        self.width = width  # None: not a terminal, cut at PIPED_CHARS
        self.day = ""

    def __call__(self, raw: bytes) -> list[str]:
        try:
            ev = json.loads(raw)
            if not isinstance(ev, dict):
                raise ValueError("not an object")
        except ValueError:
            text = raw.decode("utf-8", "replace")
            return [t("logs.unreadable", line=one_line(text, 80))]
        out = []
        try:
            when = time.localtime(float(ev.get("t") or 0))
        except (TypeError, ValueError, OverflowError, OSError):
            when = time.localtime(0)
        day = time.strftime("%Y-%m-%d", when)
        if day != self.day:
            self.day = day
            out.append(t("logs.date", date=day))
        head = f"{time.strftime('%H:%M:%S', when)}  {clean(str(ev.get('step') or '-'))}"
        head += f"  {clean(str(ev.get('kind') or '?'))}"
        room = PIPED_CHARS if self.width is None else max(20, self.width - cols(head) - 2)
        body = one_line(" ⏎ ".join(describe(ev).strip().splitlines()), room)
        out.append(f"{head}  {body}" if body else head)
        return out


def describe(ev: dict[str, Any]) -> str:
    """The text of one event: its text (a tool call with its tool, a failed result marked),
    then what its payload adds, as ``key=value``."""
    given = ev.get("payload")
    payload: dict[str, Any] = given if isinstance(given, dict) else {}
    kind, text = ev.get("kind"), str(ev.get("text") or "")
    if kind == "tool_call":
        return f"{ev.get('tool') or '?'}  {text}"
    if kind == "tool_result":
        return f"x {text}" if payload.get("is_error") else text
    if kind in PLAIN_KINDS:
        return text
    if kind == "step":
        where = f"{int(payload.get('index') or 0) + 1}/{payload.get('total', '?')}"
        flags = [k for k in ("resumed", "reused") if payload.get(k) is True]
        return " ".join([text, where, *flags])
    extra = " ".join(
        f"{k}={_short(v)}" for k, v in payload.items() if k not in QUIET_KEYS and _worth(v)
    )
    return f"{text}  {extra}".strip()


def _worth(value: Any) -> bool:
    return value is not None and value is not False and value not in ("", [], {})


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


# -- the command -----------------------------------------------------------------------


def run(run: str | None, follow_: bool, run_dir: Path) -> None:
    """``flower-super logs`` (declared in supervisor/cli.py)."""
    run_dir = run_dir.expanduser().absolute()
    record = pick_run(run_dir, run)  # FlowerError: cli.py makes it one line
    try:
        sys.exit(_print(run_dir, record, follow_))
    except KeyboardInterrupt:
        sys.exit(130)


def _print(run_dir: Path, record: FlowerRecord, follow_: bool) -> int:
    path = events_path(run_dir, record.run)

    def live() -> bool:
        return follow_ and is_live(run_dir, record.run)

    while not path.exists() and live():  # a flower just started opens its log in a moment
        time.sleep(POLL_S)
    if not path.exists():
        echo(t("logs.none", run=record.run, path=path))
        return 1
    render = Lines(_width())
    echo(t("logs.header", run=record.run, flow=record.flow, state=state_of(record)))
    if live():
        echo(t("logs.following"))
    try:
        follow(path, lambda raw: echo("\n".join(render(raw))), live)
    except OSError as exc:
        raise FlowerError(t("logs.read_failed", path=path, why=exc.strerror or exc)) from None
    if follow_:
        ended = Registry(run_dir).get(record.run) or record
        echo(t("logs.ended", state=state_of(ended)))
    return 0


def _width() -> int | None:
    if not sys.stdout.isatty():
        return None
    return terminal_columns()
