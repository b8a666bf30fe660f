"""Scripting the starter flow offline: every role of ``flower "…"`` played by the model server.

:func:`starter_script` returns a model-server script (the format is
:data:`flower.testing.SCRIPT_FORMAT`) for seed 003's ``starter_flow``, the chain that
``flower "…"`` and ``flower-super start "…"`` run, with each role matched by what flower
itself sends it, so a test names none of the markers, sections or formats:

- ``clarifier`` (step ``确认需求``): one ``mcp__human__ask`` per question, then the brief's
  four sections, 目标 / 验收标准 / 边界 / 未知与假设;
- ``goal`` (step ``设定目标``): the goal and its checklist, 目标 / 判定清单;
- ``work`` (step ``干活``): per round, one ``Agent`` call to the ``coder`` worker and a closing
  text, or a text of its own;
- ``coder-1``, ``coder-2``, …: the worker's turns in round N, the tool calls that do the work;
- ``judge-1``, ``judge-2``, …: round N's verdict (结论 / 理由 / 未通过), each answering one
  fresh judge session (``干活·判定#N``);
- ``probe``: ``ok`` to the one request ``flower`` sends to check the credentials.

A wake continues the same conversations: ``flower`` run again in the same place sends the
working session its next round (the next item of ``work``) and a new judge the next verdict.

``server.requests`` tells who asked what: ``r.conversation`` is one of the names above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from flower._errors import ConfigError
from flower.agents.roles import CLARIFIER_RULES
from flower.docs.brief import SECTIONS, Brief
from flower.docs.goal import Goal
from flower.docs.verdict import ACHIEVED, NOT_YET, STATES, UNREACHABLE, Verdict
from flower.people.human import TOOL_NAME
from flower.workflow.goal import GOAL_PROMPT, VERIFY_PROMPT
from flower.workflow.starter import CODER, WORK_PROMPT

__all__ = ["starter_script"]

#: A scripted turn: a text, or a turn object of the script format (``{"tool_use": …}`` …).
Turn: TypeAlias = str | Mapping[str, Any]

#: What ``flower`` sends to check the credentials before a run (the probe of
#: supervisor/commands/setup.py).
PROBE_PROMPT = "hi"

_DEFAULT_BRIEF = Brief(
    goal="Do what was asked.",
    accept="It is done as asked.",
    bounds="Nothing beyond what was asked.",
    unknowns="None.",
)
_DEFAULT_GOAL = Goal("Do what was asked.", ["It is done as asked."])
_REASONS = {
    ACHIEVED: "Every check passes.",
    NOT_YET: "Not every check passes yet.",
    UNREACHABLE: "This environment cannot verify it.",
}


def starter_script(
    *,
    work: Sequence[str | Sequence[Turn]],
    brief: Brief | Mapping[str, str] | str | None = None,
    goal: Goal | str | Sequence[Goal | str] | None = None,
    verdicts: Sequence[Verdict | str] | None = None,
    questions: Sequence[str | tuple[str, Sequence[str]]] = (),
) -> dict[str, Any]:
    """A model-server script that plays the whole starter flow (see the module docstring).

    ``work``: one item per round of ``干活``. A list of turns is what the ``coder`` worker
    does that round (the coordinator dispatches it with one ``Agent`` call and then says
    ``Round N done.``; a round that ends on a tool call gets that closing text too); a string
    is the coordinator's own answer, with no worker.

    ``brief``: a :class:`~flower.Brief`, or its fields as a mapping (``goal``, ``accept``,
    ``bounds``, ``unknowns``), or the clarifier's reply as text (to script an incomplete
    one). ``goal``: a :class:`~flower.Goal` or the reply as text; a list gives one per
    derivation (a wake with a sentence derives the goal again). Both have neutral defaults.

    ``verdicts``: one per round, in order: ``"achieved"``, ``"not_yet"``, ``"unreachable"``
    (with a stock reason; ``not_yet`` fails every check of the goal), a
    :class:`~flower.Verdict`, or any other text as the judge's whole reply (an unclear one, for
    instance). Default: ``not_yet`` for every round but the last, ``achieved`` for the last.

    ``questions``: what the clarifier asks the person first, each a question or a
    ``(question, options)`` pair.

    Raises :class:`~flower.ConfigError` on a malformed argument.
    """
    rounds = list(work)
    if not rounds:
        raise _bad("work needs at least one round")
    goals = _goals(goal)
    judged = list(verdicts) if verdicts is not None else _default_verdicts(len(rounds))
    coordinator: list[Turn] = []
    coders: list[dict[str, Any]] = []
    for k, item in enumerate(rounds, 1):
        if isinstance(item, str):
            coordinator.append(item)
            continue
        turns = [_turn(x, f"work round {k}") for x in item]
        closing = f"Round {k} done."
        if not turns or (isinstance(turns[-1], dict) and "tool_use" in turns[-1]):
            turns.append(closing)
        name = f"{CODER}-{k}"
        coders.append(_conversation(name, turns, marker=f"[[{name}]]"))
        coordinator += [_dispatch(name, k), closing]
    asks: list[Turn] = [_ask(q) for q in questions]
    return {
        "conversations": [
            _conversation("clarifier", [*asks, _brief_text(brief)], system=_lead(CLARIFIER_RULES)),
            _conversation("goal", [_goal_text(g) for g in goals], marker=_lead(GOAL_PROMPT)),
            *(
                {
                    **_conversation(
                        f"judge-{n}", [_verdict_text(v, goals[0])], marker=_lead(VERIFY_PROMPT)
                    ),
                    "one_session": True,
                }
                for n, v in enumerate(judged, 1)
            ),
            _conversation("work", coordinator, marker=_lead(WORK_PROMPT)),
            *coders,
            _conversation("probe", ["ok"], prompt=PROBE_PROMPT),
        ]
    }


def _lead(template: str) -> str:
    """The first line of a prompt template, up to its first field: what every request
    built from it carries."""
    return template.split("\n", 1)[0].split("{", 1)[0].strip()


def _conversation(name: str, turns: Sequence[Turn], **match: str) -> dict[str, Any]:
    texts = [t if isinstance(t, str) else t.get("text") for t in turns]
    shown = [t for t in texts if t is not None]
    twice = sorted({t for t in shown if shown.count(t) > 1})
    if twice:
        # The server tells text turns apart by their text: a repeated one would be answered
        # again and again.
        raise _bad(f"conversation {name!r} has the same text twice: {twice}")
    return {"name": name, "match": match, "turns": [_turn(t, name) for t in turns]}


def _turn(turn: Any, where: str) -> Any:
    if isinstance(turn, str):
        return turn
    if isinstance(turn, Mapping):
        return dict(turn)
    raise _bad(f"{where}: a turn is a text or a turn object, got {type(turn).__name__}")


def _dispatch(coder: str, k: int) -> dict[str, Any]:
    prompt = f"[[{coder}]] Do round {k} of the work."
    agent = {"subagent_type": CODER, "description": f"round {k}", "prompt": prompt}
    return {"tool_use": {"name": "Agent", "input": agent}}


def _ask(question: str | tuple[str, Sequence[str]]) -> dict[str, Any]:
    if isinstance(question, str):
        args: dict[str, Any] = {"question": question}
    else:
        text, options = question
        args = {"question": text, "options": list(options)}
    return {"tool_use": {"name": TOOL_NAME, "input": args}}


def _brief_text(brief: Brief | Mapping[str, str] | str | None) -> str:
    if brief is None:
        return _DEFAULT_BRIEF.prompt_block()
    if isinstance(brief, str):
        return brief
    if isinstance(brief, Brief):
        return brief.prompt_block()
    unknown = sorted(set(brief) - set(SECTIONS))
    if unknown:
        raise _bad(f"brief: unknown sections {unknown}; they are {list(SECTIONS)}")
    said = {name: str(text) for name, text in brief.items()}
    return Brief(
        goal=said.get("goal", ""),
        accept=said.get("accept", ""),
        bounds=said.get("bounds", ""),
        unknowns=said.get("unknowns", ""),
    ).prompt_block()


def _goals(goal: Goal | str | Sequence[Goal | str] | None) -> list[Goal | str]:
    if goal is None:
        return [_DEFAULT_GOAL]
    if isinstance(goal, (Goal, str)):
        return [goal]
    out = list(goal)
    if not out:
        raise _bad("goal: an empty list")
    return out


def _goal_text(goal: Goal | str) -> str:
    return goal if isinstance(goal, str) else goal.prompt_block()


def _default_verdicts(rounds: int) -> list[Verdict | str]:
    return [*[NOT_YET] * (rounds - 1), ACHIEVED]


def _verdict_text(verdict: Verdict | str, goal: Goal | str) -> str:
    if isinstance(verdict, Verdict):
        return verdict.to_markdown()
    if verdict not in STATES:
        return verdict  # the judge's whole reply, as written
    checks = goal.checks if isinstance(goal, Goal) else Goal.parse(goal).checks
    failed = list(checks) if verdict == NOT_YET else []
    return Verdict(verdict, _REASONS[verdict], failed).to_markdown()


def _bad(what: str) -> ConfigError:
    return ConfigError(f"starter_script: {what}", hint="see help(flower.testing.starter_script)")
