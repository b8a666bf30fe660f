"""The hook layer: what the main thread may not touch, what a huge tool result becomes, and
how a subagent is dispatched — enforced by SDK hooks, not asked for in prompts.

A prompt is a suggestion the model may ignore; a hook's decision is not. Hence:

- ``whitelist_guard`` makes ``allowed_tools`` exclusive for the hands-on tools (the CLI
  treats it as "runs without asking", not as "nothing else runs");
- ``delegate_guard`` turns a coordinator's own hands-on call into "dispatch a subagent";
- ``spill_guard`` writes an oversized tool result to a file the moment it exists and
  leaves a pointer, instead of compacting after the context has filled;
- ``index_guard`` keeps the workbench's ``INDEX.md`` current after every write into it;
- ``isolate_guard`` / ``foreground_guard`` edit an ``Agent`` call: a subagent runs in the
  foreground (the bundled CLI starts one in the background unless told
  ``run_in_background: false``, and a step must not report done while its workers run), and
  a role marked :func:`isolated` gets its own git worktree.

Denial texts are Chinese: the model reads them. Every main-thread-only decision rests on
:func:`_is_main_thread`. The SDK is imported inside the factories only (importing it
costs over half a second).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..i18n import define, t
from ..util.ephemeral import is_ephemeral
from ..util.fsutil import atomic_write_text, private_dir
from .workbench import Workbench

if TYPE_CHECKING:
    from claude_agent_sdk import AgentDefinition, HookMatcher
    from claude_agent_sdk.types import HookCallback

__all__ = [
    "delegate_guard",
    "foreground_guard",
    "index_guard",
    "isolate_guard",
    "isolated",
    "spill_guard",
    "wants_isolation",
    "whitelist_guard",
    "workbench_hooks",
]

log = logging.getLogger("flower")

define(
    {
        "guard.spill_failed": (
            "工具结果没能另存到 {path}({error}),原样保留",
            "tool result not spilled to {path} ({error}); kept whole",
        ),
        "guard.index_stale": (
            "工作台索引没刷新:{error}",
            "workbench index not refreshed: {error}",
        ),
        "guard.on_inject_failed": (
            "{role} 的 on_inject 出错:{error}",
            "on_inject failed for {role}: {error}",
        ),
    }
)

#: The tools that change the workspace or run things: what a coordinator delegates.
HANDS_ON = "Bash|Write|Edit|NotebookEdit"
#: The tools that only write files.
WRITE_ONLY = "Write|Edit|NotebookEdit"
#: The tools whose results can be huge: what ``spill_guard`` watches.
BULKY = "Bash|Read|Grep|Glob|WebFetch|WebSearch"

#: Characters of a spilled result kept in place after the pointer.
HEAD_CHARS = 400
#: The spill directory, under the workbench's root.
SPILL_DIRNAME = "spill"

_ISOLATE_MARK = "_flower_isolate"

Hook = Callable[[dict[str, Any], str | None, Any], Awaitable[dict[str, Any]]]

_WHITELIST_DENIAL = (
    "{role} 没有 {tool}。这是有意的设定,不是漏配了工具。"
    "把结论直接写在回复正文里,框架会从那里取;不要换别的工具或说法绕过这条限制。"
)
_DELEGATE_DENIAL = (
    "协调者不亲自动手({tool} 被拒绝)。请用 Agent 工具派一个子代理去做:"
    "在任务里写清目标和验收标准,并要求它把长输出写进文件(有工作台时写进它的 artifacts/,"
    "位置见系统提示里的「工作台」一节),回复里只给文件路径和结论。"
)
_GLANCE_HINT = "只读的一次性查看命令(如 git status、ls、cat)可以自己跑;这条不属于此类。"
_POINTER = (
    "[输出太长,已整段存到 {path}(共 {chars} 字符),用 Read 读这个文件能拿到全文。"
    "以下是前 {head} 字符:]\n"
)


def _is_main_thread(data: dict[str, Any]) -> bool:
    """Did this tool call come from the session's main thread? A subagent's tool-lifecycle
    hook input carries ``agent_id``; the main thread's never does."""
    return not data.get("agent_id")


def _matcher(matcher: str | None, hook: Hook) -> HookMatcher:
    from claude_agent_sdk import HookMatcher

    # Our hooks take and return plain dicts; the SDK's TypedDicts are those dicts' shapes.
    return HookMatcher(matcher=matcher, hooks=[cast("HookCallback", hook)])


def _deny(reason: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }


def _tool_input(data: dict[str, Any]) -> dict[str, Any]:
    value = data.get("tool_input")
    return value if isinstance(value, dict) else {}


def _inside(path: Any, base: Path, cwd: Any) -> bool:
    """Does ``path`` (relative ones taken from ``cwd``) resolve to somewhere under ``base``?"""
    if not isinstance(path, str) or not path:
        return False
    try:
        p = Path(path)
        if not p.is_absolute() and isinstance(cwd, str):
            p = Path(cwd) / p
        return p.resolve().is_relative_to(base.resolve())
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte in the path
        return False


def whitelist_guard(allowed: list[str] | None, *, role: str = "这个角色") -> HookMatcher | None:
    """Deny the main thread those of Bash/Write/Edit/NotebookEdit that ``allowed`` lacks.

    ``allowed_tools`` only means "runs without asking": a role given ``["Read"]`` can still
    call Write. Only exact tool names count as allowed (a scoped rule such as
    ``Bash(git diff:*)`` does not open Bash), so a judge that may run things keeps ``Bash``
    and still cannot ``Write``. Subagents pass: their tools are their ``AgentDefinition``'s.
    None when nothing is banned, so the caller installs nothing.
    """
    permitted = set(allowed or ())
    banned = [t for t in HANDS_ON.split("|") if t not in permitted]
    if not banned:
        return None

    async def whitelist(
        data: dict[str, Any], tool_use_id: str | None, context: Any
    ) -> dict[str, Any]:
        tool = data.get("tool_name")
        if not _is_main_thread(data) or tool not in banned:
            return {}
        return _deny(_WHITELIST_DENIAL.format(role=role, tool=tool))

    return _matcher("|".join(banned), whitelist)


def delegate_guard(*, tools: str = HANDS_ON, allow_glance: bool = False) -> HookMatcher:
    """Deny the main thread the hands-on ``tools`` (a matcher regex), saying to delegate.

    ``allow_glance`` lets through a foreground Bash whose command :func:`is_ephemeral`
    accepts — the same test, and the same foreground condition, that decides which Bash
    results expire on resume, so whatever a coordinator may glance at also goes stale.
    Subagents always pass.
    """

    async def delegate(
        data: dict[str, Any], tool_use_id: str | None, context: Any
    ) -> dict[str, Any]:
        if not _is_main_thread(data):
            return {}
        tool = data.get("tool_name")
        reason = _DELEGATE_DENIAL.format(tool=tool)
        if allow_glance and tool == "Bash":
            args = _tool_input(data)
            command = args.get("command")
            if (
                isinstance(command, str)
                and not args.get("run_in_background")
                and is_ephemeral(command)
            ):
                return {}
            reason = f"{reason}{_GLANCE_HINT}"
        return _deny(reason)

    return _matcher(tools, delegate)


def spill_guard(
    workbench: Workbench,
    *,
    threshold: int = 4000,
    tools: str = BULKY,
    main_only: bool = False,
) -> HookMatcher:
    """Move tool results of ``threshold`` characters or more to ``<root>/spill/`` at once.

    Each such string — the whole response when it is a string, else any string field of
    the response dict, nested dicts included — becomes a pointer line plus its first
    :data:`HEAD_CHARS` characters; the full text lands in ``<sha256[:16]>.txt``
    (owner-only, content-addressed, so written once). Everything else keeps its place and
    type: the CLI rejects an ``updatedToolOutput`` that does not fit the tool's schema, and
    lists are left alone (they may hold image blocks). A ``Read`` of a spill file passes
    untouched, or reading the full text back would only spill it again. If the file cannot
    be written the result stays whole (a warning is logged); a hook must not fail the tool
    call. ``main_only=True`` leaves subagents' results alone.
    """
    spill_dir = workbench.root / SPILL_DIRNAME

    async def spill(data: dict[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        if main_only and not _is_main_thread(data):
            return {}
        if data.get("tool_name") == "Read" and _inside(
            _tool_input(data).get("file_path"), spill_dir, data.get("cwd")
        ):
            return {}
        response = data.get("tool_response")
        files: dict[Path, str] = {}
        updated = _spilled(response, threshold, workbench, spill_dir, files)
        if not files:
            return {}
        try:
            await asyncio.to_thread(_write_spills, spill_dir, files)
        except OSError as exc:
            log.warning("%s", t("guard.spill_failed", path=spill_dir, error=exc))
            return {}
        return {
            "hookSpecificOutput": {"hookEventName": "PostToolUse", "updatedToolOutput": updated}
        }

    return _matcher(tools, spill)


def _spilled(
    value: Any, threshold: int, workbench: Workbench, spill_dir: Path, files: dict[Path, str]
) -> Any:
    """``value`` with each long string (at the top or in dicts at any depth) replaced by its
    pointer and head, the full texts collected in ``files``; lists and other values as they
    were."""
    if isinstance(value, dict):
        return {k: _spilled(v, threshold, workbench, spill_dir, files) for k, v in value.items()}
    if not isinstance(value, str) or len(value) < threshold:
        return value
    path = spill_dir / f"{_digest(value)}.txt"
    head = value[:HEAD_CHARS]
    pointer = _POINTER.format(path=workbench.show(path), chars=len(value), head=len(head))
    files[path] = value  # even when pointer and head are longer (a tiny threshold): api.md
    return pointer + head


def _write_spills(spill_dir: Path, files: dict[Path, str]) -> None:
    private_dir(spill_dir)
    for path, text in files.items():
        if not path.exists():  # named by content: an existing file holds this very text
            atomic_write_text(path, _writable(text))


def _digest(text: str) -> str:
    # surrogatepass: the trimming layer names its spill files the same way, so one text
    # spilled by both lands in one file.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _writable(text: str) -> str:
    """``text`` as valid UTF-8 (a lone surrogate from a JSON escape cannot be encoded)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def index_guard(workbench: Workbench) -> HookMatcher:
    """After a Write/Edit into the workbench, rewrite its ``INDEX.md``. Always ``{}``.

    The next agent learns a file exists from the index in its system prompt; a file
    written without a refresh would be invisible to it.
    """

    async def index(data: dict[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        if _inside(_tool_input(data).get("file_path"), workbench.root, data.get("cwd")):
            try:
                await asyncio.to_thread(workbench.refresh)
            except Exception as exc:  # noqa: BLE001 - a side effect must not fail the tool call
                log.warning("%s", t("guard.index_stale", error=exc))
        return {}

    return _matcher("Write|Edit", index)


def isolated(agent: AgentDefinition, flag: bool = True) -> AgentDefinition:
    """Mark ``agent`` as needing its own git worktree (``flag=False`` removes the mark);
    return the same object.

    The mark is a plain attribute, not a dataclass field, so the SDK's ``asdict()`` never
    sends it to the CLI. The cost: ``dataclasses.replace()`` drops it.
    """
    object.__setattr__(agent, _ISOLATE_MARK, bool(flag))
    return agent


def wants_isolation(agent: AgentDefinition | None) -> bool:
    """Is ``agent`` marked by :func:`isolated`? False for None."""
    return bool(getattr(agent, _ISOLATE_MARK, False))


def isolate_guard(agents: dict[str, AgentDefinition], *, on_inject: Any = None) -> HookMatcher:
    """The ``Agent`` guard: foreground always, a worktree for the roles marked isolated.

    A call from the main thread gets ``run_in_background: false`` unless it says so
    already. A call whose ``subagent_type`` names a role of ``agents`` marked by
    :func:`isolated`, and which sets neither ``cwd`` nor ``isolation`` (the two exclude
    each other; a value the model chose is respected), gets ``isolation: "worktree"``;
    ``on_inject(subagent_type, description)`` is then called. Both edits come from this
    one hook because the CLI keeps only one ``updatedInput`` per call: two hooks each
    editing the same call would not compose. The answer is ``permissionDecision: "allow"``
    with the whole edited input.
    """
    return _matcher("Agent", _agent_hook(agents, on_inject))


def foreground_guard() -> HookMatcher:
    """The ``Agent`` guard with no isolated roles: a main-thread dispatch runs in the
    foreground. Install this or :func:`isolate_guard`, never both (see there)."""
    return _matcher("Agent", _agent_hook({}, None))


def _agent_hook(agents: dict[str, AgentDefinition], on_inject: Any) -> Hook:
    async def agent(data: dict[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        if data.get("tool_name") != "Agent":
            return {}
        args = _tool_input(data)
        edits: dict[str, Any] = {}
        if _is_main_thread(data) and args.get("run_in_background") is not False:
            edits["run_in_background"] = False
        role = args.get("subagent_type")
        if (
            isinstance(role, str)
            and wants_isolation(agents.get(role))
            and not args.get("cwd")
            and not args.get("isolation")
        ):
            edits["isolation"] = "worktree"
            if on_inject is not None:
                try:
                    on_inject(role, args.get("description"))
                except Exception as exc:  # noqa: BLE001 - an observer must not cost the worktree
                    log.warning("%s", t("guard.on_inject_failed", role=role, error=exc))
        if not edits:
            return {}
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "updatedInput": {**args, **edits},
            }
        }

    return agent


def workbench_hooks(
    workbench: Workbench,
    *,
    delegate_only: bool = True,
    spill_threshold: int | None = 4000,
    agents: dict[str, AgentDefinition] | None = None,
    allow_glance: bool = False,
) -> dict[str, list[HookMatcher]]:
    """The hooks a step with a workbench runs under, by event.

    PreToolUse: ``delegate_guard`` when ``delegate_only``; the ``Agent`` guard
    (:func:`isolate_guard`: foreground, plus worktrees for marked roles) when ``agents`` is
    non-empty. PostToolUse: ``index_guard``, then ``spill_guard`` when ``spill_threshold``
    is truthy. Events with nothing to install are left out.
    """
    pre: list[HookMatcher] = []
    if delegate_only:
        pre.append(delegate_guard(allow_glance=allow_glance))
    if agents:
        pre.append(isolate_guard(agents))
    post = [index_guard(workbench)]
    if spill_threshold:
        post.append(spill_guard(workbench, threshold=spill_threshold))
    return {event: found for event, found in (("PreToolUse", pre), ("PostToolUse", post)) if found}


def one_per_event(hooks: dict[str, list[HookMatcher]]) -> dict[str, list[HookMatcher]]:
    """The same hooks as one matcher per event, each running its parts in order.

    Every hook callback costs a round trip of the CLI's control protocol, measured at about
    2.5 ms with CLI 2.1.332 even for a hook that does nothing (scripts/bench_hooks.py), and
    the CLI calls each matching matcher separately. Folded into one callback, a tool call
    pays one round trip per event, and the parts compose the way one would expect: a deny
    ends the chain and is the answer; an ``updatedInput`` is what later parts see as the
    input (the Agent guard's edit reaches the ledger); an ``updatedToolOutput`` is what later
    parts see as the response (the ledger records the spilled result, as the model gets it).
    A part's ``matcher`` is matched against the tool's name as the CLI matches it: a ``|``
    list of names, or none for every tool. Only flower's own matchers are folded; a spec's
    ``hooks`` are left as they are.
    """
    out: dict[str, list[HookMatcher]] = {}
    for event, matchers in hooks.items():
        if len(matchers) <= 1:
            out[event] = list(matchers)
        else:
            out[event] = [_matcher(None, _chain(event, list(matchers)))]
    return out


def _names(matcher: str | None) -> set[str] | None:
    if not matcher or matcher == "*":
        return None
    return set(matcher.split("|"))


def _chain(event: str, matchers: list[HookMatcher]) -> Hook:
    # The SDK types a callback by its TypedDicts; at run time they are these plain dicts.
    parts = [(_names(m.matcher), cast(Hook, hook)) for m in matchers for hook in m.hooks]

    async def chained(data: dict[str, Any], tool_use_id: str | None, ctx: Any) -> dict[str, Any]:
        tool = data.get("tool_name")
        answer: dict[str, Any] = {}
        specific: dict[str, Any] = {}
        for names, hook in parts:
            if names is not None and tool not in names:
                continue
            got: dict[str, Any] = dict(await hook(data, tool_use_id, ctx) or {})
            mine: dict[str, Any] = dict(got.get("hookSpecificOutput") or {})
            answer.update({k: v for k, v in got.items() if k != "hookSpecificOutput"})
            if mine.get("permissionDecision") == "deny":
                return {**answer, "hookSpecificOutput": mine}
            if "updatedInput" in mine:
                data = {**data, "tool_input": mine["updatedInput"]}
            if "updatedToolOutput" in mine:
                data = {**data, "tool_response": mine["updatedToolOutput"]}
            specific.update(mine)
        if specific:
            specific["hookEventName"] = event
            answer["hookSpecificOutput"] = specific
        return answer

    return chained
