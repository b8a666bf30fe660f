"""``flower-super cancel RUN``: stop a live flower the way SIGTERM does.

The flower gets SIGTERM (its own handler writes the in-flight step as one
``killed-by-signal`` row, stops its children and dies of the signal), so the run stays
resumable: ``flower-super start`` in the same place carries on. RUN is a run id as
``status`` prints it, or a unique prefix of one, looked up in the run state's registry
(the run_dir's, or with a state URL the workspace's). A run that is not live, that no
record names, or that runs on another machine (a signal cannot reach it from here), is one
line and exit status 2.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from flower import FlowerError
from flower.i18n import define, t
from flower.state.backends import RunState
from flower.state.registry import FlowerRecord, is_alive, this_host

define(
    {
        "cancel.unknown": (
            "{where} 里没有叫 {run!r} 的运行",
            "no flower run {run!r} in {where}",
        ),
        "cancel.unknown.hint": (
            "flower-super status {option} {label} 会列出那里的运行",
            "flower-super status {option} {label} lists the runs there",
        ),
        "cancel.elsewhere": (
            "运行 {run} 在另一台机器 {host} 上跑(pid {pid}),从这里发不了信号",
            "run {run} runs on another machine, {host} (pid {pid}); no signal reaches it from here",
        ),
        "cancel.elsewhere.hint": (
            "在 {host} 上运行 flower-super cancel {run}",
            "run flower-super cancel {run} on {host}",
        ),
        "cancel.ambiguous": (
            "{run!r} 对得上 {n} 个运行({names})",
            "{run!r} names {n} runs ({names})",
        ),
        "cancel.ambiguous.hint": ("多给几位", "give more of it"),
        "cancel.not_running": (
            "运行 {run} 没在跑(它是 {state}),没什么可停的",
            "run {run} is not running (it is {state}); nothing to cancel",
        ),
        "cancel.not_running.hint": (
            "在它的工作区里再跑一次就接着做",
            "flower-super start in its workspace carries it on",
        ),
        "cancel.ended": ("运行 {run} 刚刚结束了", "run {run} ended just now"),
        "cancel.ended.hint": ("没什么可停的", "nothing to cancel"),
        "cancel.not_allowed": (
            "无权给 pid {pid}(运行 {run})发信号",
            "not allowed to signal pid {pid} (run {run})",
        ),
        "cancel.not_allowed.hint": (
            "用启动它的那个用户来停",
            "cancel it as the user who started it",
        ),
        "cancel.still_there": (
            "flower-super:已给 pid {pid}(运行 {run})发了 SIGTERM,它还在",
            "flower-super: sent SIGTERM to pid {pid} (run {run}); it is still there",
        ),
        "cancel.stopped": (
            "已停下运行 {run}(pid {pid});接着做:{resume}",
            "stopped run {run} (pid {pid}); to carry it on: {resume}",
        ),
    }
)
STOP_WAIT_S = 30.0  # the handler writes one row and stops the children: well under a second


@dataclass(eq=False, repr=False)  # unused, and ~0.2 ms of start-up each
class Cancelled:
    record: FlowerRecord
    stopped: bool  # the process is gone (False: still there after STOP_WAIT_S)


def find_run(state: RunState, run: str) -> FlowerRecord:
    """The record ``run`` names (a run id or a unique prefix) in ``state``'s registry, or a
    FlowerError."""
    records: list[FlowerRecord] = state.registry.records()
    exact = [r for r in records if r.run == run]
    matches = exact or [r for r in records if r.run.startswith(run)]
    if not matches:
        scope = state.scope
        hint = t("cancel.unknown.hint", option=scope.option, label=scope.label)
        raise FlowerError(t("cancel.unknown", run=run, where=state.where), hint=hint)
    if len(matches) > 1:
        names = ", ".join(r.run for r in matches[:4])
        raise FlowerError(
            t("cancel.ambiguous", run=run, n=len(matches), names=names),
            hint=t("cancel.ambiguous.hint"),
        )
    return matches[0]


def cancel(state: RunState, run: str, *, wait_s: float = STOP_WAIT_S) -> Cancelled:
    """SIGTERM the live flower ``run`` names and wait for it to go."""
    import signal  # only to send it: show and logs import this module for find_run

    record = find_run(state, run)
    if record.state != "running" or not record.alive:
        raise FlowerError(
            t("cancel.not_running", run=record.run, state=record.state),
            hint=t("cancel.not_running.hint"),
        )
    if record.host and record.host != this_host():
        raise FlowerError(
            t("cancel.elsewhere", run=record.run, host=record.host, pid=record.pid),
            hint=t("cancel.elsewhere.hint", run=record.run, host=record.host),
        )
    try:
        os.kill(record.pid, signal.SIGTERM)
    except ProcessLookupError:
        raise FlowerError(t("cancel.ended", run=record.run), hint=t("cancel.ended.hint")) from None
    except PermissionError:
        raise FlowerError(
            t("cancel.not_allowed", pid=record.pid, run=record.run),
            hint=t("cancel.not_allowed.hint"),
        ) from None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not is_alive(record.pid, record.pid_started):
            return Cancelled(record, True)
        time.sleep(0.05)
    return Cancelled(record, False)
