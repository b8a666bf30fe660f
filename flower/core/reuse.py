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


def summary(report: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and the cost saved (what the reused results cost when they were made)."""
    reused = [e for e in report if e.get("outcome") == "reused"]
    return {
        "reused": len(reused),
        "executed": len(report) - len(reused),
        "saved_usd": round(sum(float(e.get("saved_usd") or 0) for e in reused), 6),
        "steps": report,
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
        lines.append(t(key, step=e.get("step"), scope=e.get("scope"), why=e.get("why")))
    return lines
