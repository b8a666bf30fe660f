"""``flower-super workers``: a cluster's workers as each last reported itself to the state.

Every ``flower-super worker`` writes a row to the run state's database every few seconds
(:mod:`supervisor.cluster.report`): its queue, host and pid, its slots, the attempts it runs
and its counts. This reads those rows, from any machine that has the state URL, and judges
each worker's silence by the database's clock (never this machine's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flower.i18n import define, t
from flower.state.backends import RunState
from supervisor.inspect.status import dur

#: A worker that has not reported for this long is shown as silent (it reports every 2 s:
#: this is several missed reports, not one slow write).
SILENT_S = 10.0

define(
    {
        "workers.head": (
            "{state} 里的 worker:{n} 个{queue}",
            "workers in {state}: {n}{queue}",
        ),
        "workers.on_queue": ("(队列 {queue})", " (queue {queue})"),
        "workers.none": (
            "{state} 里没有 worker 报到过{queue}",
            "no worker has reported to {state}{queue}",
        ),
        "workers.none.hint": (
            "在要干活的机器上起一个:flower-super worker --queue 名字"
            "(和 supervisor 用同一个状态地址)",
            "start one where the work should run: flower-super worker --queue NAME (with the "
            "supervisor's state URL)",
        ),
        "workers.row": (
            "  {host} pid {pid}  队列 {queue}  在跑 {busy}/{slots}  {state}",
            "  {host} pid {pid}  queue {queue}  running {busy}/{slots}  {state}",
        ),
        "workers.alive": ("{ago} 前报到,已跑 {up}", "reported {ago} ago, up {up}"),
        "workers.silent": (
            "! 已经 {ago} 没报到(死了、卡住了,或者连不上数据库)",
            "! silent for {ago} (dead, frozen, or cut off from the database)",
        ),
        "workers.stopped": ("{ago} 前停了", "stopped {ago} ago"),
        "workers.counts": (
            "    完成 {finished} · 失败 {failed} · 接手 {takeovers} · 还回队列 {refusals}",
            "    finished {finished} · failed {failed} · taken over {takeovers} · handed "
            "back {refusals}",
        ),
        "workers.attempt": (
            "    > run {run}  {label}(第 {attempt} 次派发,{took})",
            "    > run {run}  {label} (dispatch try {attempt}, {took})",
        ),
    }
)


@dataclass
class WorkerView:
    row: dict[str, Any]
    state: str  # "alive" | "silent" | "stopped"

    def to_json(self) -> dict[str, Any]:
        return {**self.row, "state": self.state}


def collect(state: RunState, queue: str | None, everyone: bool) -> list[WorkerView]:
    """The workers of ``queue`` (every queue: None), stopped ones only with ``everyone``."""
    out = []
    for row in state.workers.rows(queue):
        if row.get("stopped_at") is not None:
            kind = "stopped"
        elif float(row["now"]) - float(row["heartbeat_at"]) > SILENT_S:
            kind = "silent"
        else:
            kind = "alive"
        if kind != "stopped" or everyone:
            out.append(WorkerView(row, kind))
    return out


def render_text(views: list[WorkerView], where: str, queue: str | None) -> str:
    on = t("workers.on_queue", queue=queue) if queue else ""
    if not views:
        return t("workers.none", state=where, queue=on)
    lines = [t("workers.head", state=where, n=len(views), queue=on)]
    for v in views:
        r = v.row
        now = float(r["now"])
        if v.state == "stopped":
            said = t("workers.stopped", ago=dur(now - float(r["stopped_at"])))
        elif v.state == "silent":
            said = t("workers.silent", ago=dur(now - float(r["heartbeat_at"])))
        else:
            said = t(
                "workers.alive",
                ago=dur(now - float(r["heartbeat_at"])),
                up=dur(now - float(r["started_at"])),
            )
        running = list(r.get("running") or []) if v.state != "stopped" else []
        lines.append(
            t(
                "workers.row",
                queue=r["queue"],
                host=r["host"],
                pid=r.get("pid", "?"),
                busy=len(running),
                slots=r.get("slots", "?"),
                state=said,
            )
        )
        for a in running:
            took = dur(now - float(a.get("since") or now))
            lines.append(
                t(
                    "workers.attempt",
                    run=a.get("run"),
                    label=a.get("label"),
                    attempt=a.get("try", 1),
                    took=took,
                )
            )
        counts = {k: int(r.get(k) or 0) for k in ("finished", "failed", "takeovers", "refusals")}
        lines.append(t("workers.counts", **counts))
    return "\n".join(lines)
