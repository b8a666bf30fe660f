"""``lineage.json`` as a file: its name, its shape, and reading it without judging it.

Light on purpose (json and a dataclass): ``status`` reads the lineage of a run_dir through
:func:`peek` and :func:`damage` without loading :mod:`.lineage` (its locks and writers).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LINEAGE_NAME = "lineage.json"
JUDGE_MARK = "·判定"
_SUFFIX = re.compile(r"#(?:retry|round)\d+$")

__all__ = ["JUDGE_MARK", "LINEAGE_NAME", "SHAPE", "bare_name", "damage", "peek"]


def bare_name(label: str) -> str | None:
    """The lineage key of a step-attempt label, or None when it must never be recorded.

    ``name``, ``name#retryN`` and ``name#roundN`` all map to ``name``; a judge label
    (``name·判定#N``, anything containing ``·判定``) maps to None: the judge is always a
    fresh session and never enters lineage.
    """
    if not label or JUDGE_MARK in label:
        return None
    return _SUFFIX.sub("", label) or None


@dataclass
class _State:
    """A well-formed lineage file as read from disk (steps not yet checked against the store)."""

    workspace: str
    woke: int = 0
    steps: dict[str, str] = field(default_factory=dict)


SHAPE = 'does not have the shape {"workspace": path, "woke": N, "steps": {step: session}}'


def _diagnose(text: str) -> tuple[_State | None, str]:
    """The file's content if it has the right shape, else None and what is wrong with it."""
    if not text.strip():
        return None, "is empty"
    try:
        data = json.loads(text)
    except ValueError:
        return None, "is not valid JSON (damaged, or cut short mid-write)"
    if not isinstance(data, dict):
        return None, SHAPE
    workspace, woke, steps = data.get("workspace"), data.get("woke", 0), data.get("steps", {})
    if not isinstance(workspace, str) or not workspace:
        return None, SHAPE
    if type(woke) is not int or woke < 0 or not isinstance(steps, dict):
        return None, SHAPE
    good = {k: v for k, v in steps.items() if isinstance(v, str) and v}
    return _State(workspace, woke, good), ""


def _parse(text: str) -> _State | None:
    """The file's content if it has the right shape, else None (= start fresh)."""
    return _diagnose(text)[0]


def _read_file(path: Path) -> tuple[_State | None, str]:
    """A lineage file's content and, when it has none usable, why ('' when it is missing)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, ""
    except UnicodeDecodeError:
        return None, "is not UTF-8 text"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    return _diagnose(text)


def damage(run_dir: str | Path) -> str | None:
    """What is wrong with ``<run_dir>/lineage.json`` (None when it is missing or well-formed)."""
    return _read_file(Path(run_dir) / LINEAGE_NAME)[1] or None


def peek(run_dir: str | Path) -> dict[str, Any]:
    """``lineage.json`` as it stands (workspace, woke, steps), not checked against any store
    or workspace; ``{}`` when missing or malformed. For readers such as ``status``."""
    try:
        state = _parse((Path(run_dir) / LINEAGE_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return {}
    return (
        {}
        if state is None
        else {"workspace": state.workspace, "woke": state.woke, "steps": state.steps}
    )
