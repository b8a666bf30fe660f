"""The reuse report (seed 004): which steps were reused and which ran, and why.

Light on purpose (``flower-super status`` prints it): the catalogue only.
"""

from __future__ import annotations

from typing import Any

from ..i18n import define, t

define(
    {
        "memo.report.head": (
            "-- 复用 {reused} 步 · 执行 {ran} 步 · 省下 ${saved:.4f}",
            "-- reused {reused} · ran {ran} · saved ${saved:.4f}",
        ),
        "memo.report.reused": (
            "   + {step}  复用({scope}):{why}",
            "   + {step}  reused ({scope}): {why}",
        ),
        "memo.report.ran": ("   > {step}  执行:{why}", "   > {step}  ran: {why}"),
        "memo.report.failed": ("   x {step}  失败:{why}", "   x {step}  failed: {why}"),
    }
)


define(
    {
        "memo.why.same_in_run": (
            "上次的运行 {run} 做完了它,输入没变",
            "the unfinished run {run} completed it with the same input",
        ),
        "memo.why.same_cross": (
            "运行 {run} 用同样的输入和指纹算过它",
            "run {run} computed it with the same input and fingerprints",
        ),
        "memo.why.changed": ("变了:{what}", "changed: {what}"),
        "memo.why.never": ("从没跑过", "never ran"),
        "memo.why.ran_unfinished": ("以前跑过,没做完", "ran before, not finished"),
        "memo.why.ran_again": ("以前跑过;这是新的一次运行", "ran before; this is a new run"),
        "memo.why.unfinished": ("上次没跑完", "it did not finish last time"),
        "memo.why.expired": ("缓存的结果过期了或不在了", "the stored result expired or is gone"),
        "memo.why.off": ("缓存关着(scope=off)", "caching is off for it (scope=off)"),
        "memo.why.not_idempotent": (
            "不可缓存:idempotent=False",
            "not cacheable: idempotent=False",
        ),
        "memo.why.not_cacheable": ("不能跨运行复用:{why}", "not cacheable across runs: {why}"),
        "memo.no_cross.idempotent": (
            "idempotent=False:它的副作用不可逆",
            "idempotent=False: its side effects are irreversible",
        ),
        "memo.no_cross.gate": (
            "它有 gate(被判定的步骤):上周的判定不是今天的",
            "it has a gate (a judged step): last week's verdict is not today's",
        ),
        "memo.no_cross.human": (
            "它要和人说话(带着 HumanChannel 的工具)",
            "it talks to a person (a HumanChannel's tools)",
        ),
    }
)


def why(key: str, **fields: Any) -> dict[str, Any]:
    """A reason, kept as its catalogue key and fields: a report is shown later, maybe to a
    person with another language. A field may itself be ``{"key": …}`` (a nested reason)."""
    return {"key": key, "fields": fields}


def why_text(reason: Any) -> str:
    """A stored reason in the language of whoever reads it now."""
    if not isinstance(reason, dict) or "key" not in reason:
        return str(reason or "")
    fields = {
        k: (why_text(v) if isinstance(v, dict) and "key" in v else v)
        for k, v in (reason.get("fields") or {}).items()
    }
    try:
        return t(str(reason["key"]), **fields)
    except (KeyError, IndexError, ValueError):
        return str(reason["key"])


def summary(report: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and the cost saved (what the reused results cost when they were made)."""
    reused = [e for e in report if e.get("outcome") == "reused"]
    return {
        "reused": len(reused),
        "executed": len(report) - len(reused),
        "saved_usd": round(sum(float(e.get("saved_usd") or 0) for e in reused), 6),
        "steps": [{**e, "why": why_text(e.get("why"))} for e in report],
    }


def report_lines(report: list[dict[str, Any]]) -> list[str]:
    """The reuse report as lines for a person (the end of a run, ``status``)."""
    if not report:
        return []
    s = summary(report)
    lines = [t("memo.report.head", reused=s["reused"], ran=s["executed"], saved=s["saved_usd"])]
    for e in report:
        outcome = str(e.get("outcome"))
        key = {"reused": "memo.report.reused", "failed": "memo.report.failed"}.get(
            outcome, "memo.report.ran"
        )
        lines.append(t(key, step=e.get("step"), scope=e.get("scope"), why=why_text(e.get("why"))))
    return lines
