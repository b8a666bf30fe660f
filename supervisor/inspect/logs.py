"""``flower-super logs [-f] [RUN]``: a run's events, one readable line each.

It prints the run's event log (written by that run's supervisor, :mod:`flower.state.eventlog`)
as ``HH:MM:SS  step  kind  text``, every text cleaned of escape sequences
(:func:`flower.util.sanitize.clean`) and cut to one line; a line names the date whenever it
changes. The log is ``<run_dir>/logs/<run id>/events.jsonl`` with local state, the run's
event rows with a state URL. RUN is a run id or a unique prefix, as ``cancel`` takes it (the
registry resolves it); nothing means the latest run.

``-f`` keeps reading while that flower is live (its record says running and its process,
checked by pid and start time, still exists; on another machine, its lease runs): the run
state's event rows are waited on (a file is polled, a database sends NOTIFY), waking at least
every :data:`WAIT_S` to look at the record; once the flower is gone the rest is printed and
the command ends (exit 0). Ctrl-C ends it quietly (exit 130). A run from before the event
log existed has no file: one line says so (exit 1).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flower import FlowerError
from flower.i18n import define, t
from flower.state.backends import RunState
from flower.state.registry import RUNNING, FlowerRecord, state_of
from flower.util.sanitize import clean
from supervisor.inspect.cancel import find_run
from supervisor.terminal.columns import terminal_columns
from supervisor.terminal.columns import width as cols
from supervisor.terminal.out import echo, one_line

if TYPE_CHECKING:  # the seam's module loads the SDK; logs only needs the name
    from flower.state.seam import EventRows

WAIT_S = 1.0  # a database's event wait wakes at least this often to see if the run ended
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
            "run {run} 在 {where} 里没有事件(这次运行早于事件日志,或还没开始)",
            "run {run} has no events in {where} (the run predates event logs, or has not begun)",
        ),
        "logs.ended": ("-- 这个 flower 已结束({state})", "-- that flower has ended ({state})"),
        "logs.following": (
            "-- 跟随中,flower 结束时停止(Ctrl-C 退出)",
            "-- following until the flower ends (Ctrl-C to stop)",
        ),
        "logs.read_failed": ("{path} 读不了:{why}", "{path} cannot be read: {why}"),
        "logs.unreadable": ("? 读不了的一行:{line}", "? unreadable line: {line}"),
        "logs.no_runs": ("{where} 里还什么都没跑过", "nothing has run in {where} yet"),
        "logs.no_runs.hint": (
            "在启动 flower 的目录里运行,或用 -r 指定运行目录",
            "run this where you started flower, or pass -r RUN_DIR",
        ),
    }
)


def pick_run(state: RunState, run: str | None) -> FlowerRecord:
    """The record ``run`` names (cancel's resolution), or the latest run's."""
    if run is not None:
        return find_run(state, run)
    records: list[FlowerRecord] = state.registry.records()
    if not records:
        raise FlowerError(t("logs.no_runs", where=state.where), hint=t("logs.no_runs.hint"))
    return records[-1]


def is_live(state: RunState, run: str) -> bool:
    """Is the flower of ``run`` still running (as status and cancel judge it)?"""
    record = state.registry.get(run)
    return record is not None and record.state == RUNNING and record.alive


# -- one line --------------------------------------------------------------------------


class Lines:
    """Renders event lines, with a date line whenever the day changes."""

    def __init__(self, width: int | None) -> None:
        self.width = width  # None: not a terminal, cut at PIPED_CHARS
        self.day = ""

    def event(self, ev: dict[str, Any]) -> list[str]:
        """One event (``{"unreadable": text}``: a line of a log that is no event)."""
        if set(ev) == {"unreadable"}:
            return [t("logs.unreadable", line=one_line(str(ev["unreadable"]), 80))]
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


def run(run: str | None, follow_: bool, state: RunState) -> None:
    """``flower-super logs`` (declared in supervisor/cli.py)."""
    record = pick_run(state, run)  # FlowerError: cli.py makes it one line
    try:
        sys.exit(_print(state, record, follow_))
    except KeyboardInterrupt:
        sys.exit(130)


def _print(state: RunState, record: FlowerRecord, follow_: bool) -> int:
    def live() -> bool:
        return follow_ and is_live(state, record.run)

    render = Lines(_width())
    where = state.events_where(record.run)
    try:
        found = follow_rows(
            state.events,
            record.run,
            lambda ev: echo("\n".join(render.event(ev))),
            live,
            header=lambda going: _header(record, going),
        )
    except OSError as exc:
        raise FlowerError(t("logs.read_failed", path=where, why=exc.strerror or exc)) from None
    if not found:
        echo(t("logs.none", run=record.run, where=where))
        return 1
    if follow_:
        ended = state.registry.get(record.run) or record
        echo(t("logs.ended", state=state_of(ended)))
    return 0


def _header(record: FlowerRecord, following: bool) -> None:
    echo(t("logs.header", run=record.run, flow=record.flow, state=state_of(record)))
    if following:
        echo(t("logs.following"))


def follow_rows(
    rows: EventRows,
    run: str,
    emit: Callable[[dict[str, Any]], None],
    live: Callable[[], bool],
    *,
    header: Callable[[bool], None],
    wait_s: float = WAIT_S,
) -> bool:
    """:func:`follow` for a database's event rows (``rows.read``/``rows.wait``): every event
    of ``run`` to ``emit``, then new ones as they come while ``live()``, then the rest.
    ``header(following)`` is called once before the first event; False when the run has no
    event at all (and is not live)."""
    after = 0
    going = live()
    events = rows.read(run, after)
    while not events and going:  # a flower just started writes its first event soon
        rows.wait(run, after, wait_s)
        going = live()
        events = rows.read(run, after)
    if not events:
        return False
    header(going)
    while True:
        for pos, ev in events:
            emit(ev)
            after = pos
        if not going:
            return True
        rows.wait(run, after, wait_s)
        going = live()  # asked before reading: what was written before it ended is read
        events = rows.read(run, after)


def _width() -> int | None:
    if not sys.stdout.isatty():
        return None
    return terminal_columns()
