"""Is a flow valid? Every problem is one line naming the step and the rule (seed 004's
``/tf verify``): ``flower-super verify --flow F``, ``flower run --verify F``, and before any
model call in ``flower-super start --flow`` and ``flower run``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import ConfigError
from ..i18n import define, t
from .memo import SCOPES, why_not_cross_run

if TYPE_CHECKING:
    from .base import Workflow

define(
    {
        "verify.scope": (
            "步骤 '{step}':cache 的 scope {scope!r} 不是 run-only、cross-run、off 之一",
            "step '{step}': cache scope {scope!r} is not one of run-only, cross-run, off",
        ),
        "verify.cross_run": (
            "步骤 '{step}':不能 cross-run:{why}",
            "step '{step}': cross-run is not allowed: {why}",
        ),
        "verify.fingerprint": ("步骤 '{step}':{problem}", "step '{step}': {problem}"),
        "verify.ttl": ("步骤 '{step}':{problem}", "step '{step}': {problem}"),
        "verify.not_cache": (
            "步骤 '{step}':cache 要是 flower.Cache(...),给的是 {kind}",
            "step '{step}': cache must be a flower.Cache(...), got a {kind}",
        ),
        "verify.invalid": (
            "流程 '{flow}' 有 {n} 处不对:\n{lines}",
            "flow '{flow}' has {n} {n|problem|problems}:\n{lines}",
        ),
        "verify.invalid.hint": (
            "改好再跑;flower-super verify --flow … 只检查不跑",
            "fix them and run again; flower-super verify --flow … checks without running",
        ),
    }
)


class FlowInvalid(ConfigError):
    """A flow :func:`verify` finds problems in; ``problems`` are its lines."""

    def __init__(self, flow: str, problems: list[str]) -> None:
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            t("verify.invalid", flow=flow, n=len(problems), lines=lines),
            hint=t("verify.invalid.hint"),
        )
        self.problems = problems


def verify(wf: Workflow) -> list[str]:
    """Every problem of ``wf`` (empty: valid), one line each naming the step and the rule."""
    from ..cache import check_entry, check_ttl
    from .memo import Cache

    problems: list[str] = []
    for step in wf.steps:
        cache: Any = step.cache  # whatever the flow put there
        if cache is None:
            continue
        if not isinstance(cache, Cache):
            problems.append(t("verify.not_cache", step=step.name, kind=type(cache).__name__))
            continue
        if cache.scope not in SCOPES:
            problems.append(t("verify.scope", step=step.name, scope=cache.scope))
        if cache.scope == "cross-run":
            why = why_not_cross_run(step)
            if why:
                problems.append(t("verify.cross_run", step=step.name, why=why))
        for entry in cache.fingerprint:
            problem = check_entry(entry)
            if problem:
                problems.append(t("verify.fingerprint", step=step.name, problem=problem))
        problem = check_ttl(cache.ttl)
        if problem:
            problems.append(t("verify.ttl", step=step.name, problem=problem))
    return problems


def check(wf: Workflow) -> None:
    """Raise :class:`FlowInvalid` when ``wf`` has problems."""
    problems = verify(wf)
    if problems:
        raise FlowInvalid(wf.name, problems)
