"""An AgentSpec across machines: by name and plain fields, its code from the flow.

A forked step child gets the supervisor's very AgentSpec object. An attempt placed on another
machine cannot: hooks, in-process MCP servers and subagent definitions are Python objects
(and ``env`` may hold secrets, which never travel). So the attempt carries :func:`to_wire`:
the spec's name, its fingerprint and its plain fields; the machine that runs it loads the
same flow, which builds the same specs (every AgentSpec made in a process is remembered,
weakly: :func:`flower.agents.agent.made`), and :func:`from_wire` finds the one with that
name — the very one when the fingerprints agree, else that one with the plain fields as sent
(a spec the step loop derived from it, such as a handoff turn's with its budget lifted).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from .._errors import ConfigError
from .agent import AgentSpec, CompactPolicy, made

__all__ = ["PLAIN_FIELDS", "from_wire", "to_wire"]

#: The fields that are data (no code, no secrets): what travels.
PLAIN_FIELDS = (
    "instructions",
    "allowed_tools",
    "disallowed_tools",
    "model",
    "effort",
    "max_turns",
    "max_budget_usd",
    "permission_mode",
    "glance",
    "workbench",
    "delegate_only",
)


def to_wire(spec: AgentSpec) -> dict[str, Any]:
    """What an attempt on another machine needs to find ``spec`` again."""
    plain: dict[str, Any] = {name: getattr(spec, name) for name in PLAIN_FIELDS}
    plain["allowed_tools"] = list(spec.allowed_tools)
    plain["disallowed_tools"] = list(spec.disallowed_tools)
    if spec.compact is not None:
        plain["compact"] = {"mode": spec.compact.mode, "window": spec.compact.window}
    return {"name": spec.name, "fingerprint": spec.fingerprint(), "fields": plain}


def from_wire(data: dict[str, Any]) -> AgentSpec:
    """The spec :func:`to_wire` described, from the specs this process's flow made.

    Raises :class:`~flower.ConfigError` when no spec of that name was made here (the flow
    loaded is not the one the attempt came from)."""
    name = str(data.get("name") or "")
    candidates = made(name)
    want = str(data.get("fingerprint") or "")
    for spec in candidates:
        if spec.fingerprint() == want:
            return spec
    if not candidates:
        raise ConfigError(
            f"no agent named {name!r} in the flow loaded here",
            hint="the worker must load the same flow (file or module) as the supervisor",
        )
    plain = dict(data.get("fields") or {})
    compact = plain.pop("compact", None)
    known = {f.name for f in fields(AgentSpec)}
    changes = {k: v for k, v in plain.items() if k in known and k in PLAIN_FIELDS}
    if compact is not None:
        changes["compact"] = CompactPolicy(**compact)
    return replace(candidates[-1], **changes)
