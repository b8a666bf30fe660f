"""``flower-super show [RUN | STEP]``: a step's conversation, readable, from sessions.db.

What is shown (the ``--json`` document holds the same, with full texts):

- a header per conversation: the step, its session id, and every manifest row of that
  session (label, run, ok, turns, cost), plus "running now" when a live flower is in it;
- the turns in order: prompts and other user text, the model's text (wrapped), each tool
  call on one line (``* Bash  ls -la``: the tool and its most telling argument), each
  result folded to its first line and a ``(+N lines)`` count (an error marked ``x``), a
  thinking block as one line. A call whose result the transcript does not hold yet comes
  with what the tool ledger knows (the CLI writes a turn's result only after it sent the
  next request), or "still running".
- what the CLI wrote itself, under its own name (``CLI``) and never as the model's or the
  person's words: an API error, its "No response requested." filler, a turn cut off (by an
  interrupt, or a session that ended), a compaction summary, system notes (system
  reminders, ``isMeta`` entries), background-task notices, command output. A tool result
  the CLI filled in for a call that was cut off says what happened to the call; a
  subagent's result is its report, without the frame the CLI hands it back in
  (:func:`flower.step.events.readable_result`).

What the argument names, tried in this order:

- nothing: the latest step of the latest run (the step in flight, if that run is live);
- a run id: every conversation of that run, one after the other, in the order it ran them
  (a session that several attempts continued, retries or judged rounds, is shown once, its
  header listing them all);
- a step name or label (``干活``, ``干活#round2``, ``干活·判定#1``): that step's session, by
  the live flower running it, else lineage.json, else the last manifest row of that label;
- a unique prefix of a run id (as ``cancel`` takes it).

Everything is read through the run state (:mod:`flower.state.backends`): its registry,
manifest rows and lineage, and the transcripts and tool ledger of its sessions. Local
sessions.db is opened read-only (``mode=ro``), so a running flower is never disturbed and a
run_dir is never made; what it has committed is what is shown, and nothing here imports the
SDK. With a state URL the transcripts are read from the database's session store
(``load_sync``), under the workspace's identity, and the ledger from its rows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from flower import FlowerError
from flower.i18n import define, t
from flower.state.backends import RunState
from flower.state.lineage_file import bare_name
from flower.state.registry import RUNNING, FlowerRecord, state_of
from flower.step.events import (
    NO_RESPONSE,
    cut_kind,
    entry_is_synthetic,
    readable_result,
    reminders,
    tagged,
)
from flower.util.sanitize import clean
from supervisor.inspect.cancel import find_run
from supervisor.terminal.columns import line_width
from supervisor.terminal.columns import width as cols
from supervisor.terminal.out import echo, one_line

CALL_CHARS = 120  # a tool call's argument, cut
RESULT_CHARS = 160  # the first line of a tool result, cut
MAX_WIDTH = 100

define(
    {
        "show.user": ("用户", "user"),
        "show.model": ("模型", "model"),
        "show.cli": ("CLI", "CLI"),
        "show.header": ("== {step}  · 会话 {session}", "== {step}  · session {session}"),
        "show.row": (
            "   {mark} {step}  run {run}  {turns} 轮  ${cost:.4f}  {took:.1f}s{error}",
            "   {mark} {step}  run {run}  turns {turns}  ${cost:.4f}  {took:.1f}s{error}",
        ),
        "show.live": (
            "   … 正在进行:run {run}(pid {pid}),显示的是它目前写进 sessions.db 的内容",
            "   … running now: run {run} (pid {pid}); shown is what it has stored so far",
        ),
        "show.no_turns": (
            "   (sessions.db 里还没有这条会话的内容)",
            "   (nothing of it in sessions.db yet)",
        ),
        "show.run": (
            "run {run} · {flow} · {state} · {n} 条会话",
            "run {run} · {flow} · {state} · {n} {n|conversation|conversations}",
        ),
        "show.lines": ("(共 {n} 行)", "({n} {n|line|lines})"),
        "show.thinking": ("(思考,{n} 字,略)", "(thinking, {n} chars, omitted)"),
        "show.redacted": ("(思考,已加密)", "(thinking, redacted)"),
        "show.meta": ("(系统附注)", "(system note)"),
        "show.compact": ("(压缩摘要,{n} 行)", "(compaction summary, {n} {n|line|lines})"),
        "show.synthetic": ("(CLI 自己补的一句)", "(written by the CLI itself)"),
        "show.filler": (
            "(CLI 补的占位回复:上一轮没有回答,不是模型说的)",
            "(a placeholder the CLI wrote for a turn that got no answer; not the model's)",
        ),
        "show.tools_used": ("此前用过的工具:{tools}", "tools used before: {tools}"),
        "show.notice": ("(后台任务)", "(background task)"),
        "show.output": ("(命令输出)", "(command output)"),
        "show.cut.turn.user": ("(这一轮被人打断了)", "(this turn was interrupted)"),
        "show.cut.turn.ended": (
            "(这一轮没做完:会话先结束了)",
            "(this turn did not finish: the session ended first)",
        ),
        "show.cut.stopped": (
            "x 执行中被打断(可能已部分或全部生效)",
            "x stopped while it ran (it may have taken effect in part or in full)",
        ),
        "show.cut.user": ("x 被人打断了", "x interrupted"),
        "show.cut.skipped": (
            "- 没有执行(这一轮提前结束了)",
            "- not run (the turn ended before it)",
        ),
        "show.cut.copied": (
            "? 没有结果(这份会话是复制来的,复制时它还没结果)",
            "? no result (this session is a copy made before the call had one)",
        ),
        "show.image": ("[图片]", "[image]"),
        "show.block": ("[{kind}]", "[{kind}]"),
        "show.running": ("… 还在执行", "… still running"),
        "show.unfinished": (
            "? 没有结果(会话在它结束前停了)",
            "? no result (the session stopped before it ended)",
        ),
        "show.ledger": ("(结果取自工具账本)", "(result from the tool ledger)"),
        "show.none": ("{where} 里还什么都没跑过", "nothing has run in {where} yet"),
        "show.none.hint": (
            "在启动 flower 的目录里运行,或用 -r 指定运行目录",
            "run this where you started flower, or pass -r RUN_DIR",
        ),
        "show.unknown": (
            "{where} 里没有叫 {what!r} 的 run 或步骤",
            "no run or step {what!r} in {where}",
        ),
        "show.unknown.hint": (
            "flower-super status 列出 run;步骤名见 lineage.json 和 manifest.json",
            "flower-super status lists the runs; step names are in lineage.json and manifest.json",
        ),
        "show.no_session": (
            "run {run} 还没有开始任何会话",
            "run {run} has no conversation yet",
        ),
        "show.no_session.hint": (
            "它刚启动的话,过一会儿再看",
            "if it has just started, look again in a moment",
        ),
    }
)


# -- what to show ----------------------------------------------------------------------


@dataclass
class Target:
    """One conversation to show: a session and what ran in it."""

    session_id: str
    labels: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)  # its manifest rows, any run
    live: FlowerRecord | None = None  # the live flower in it now

    @property
    def step(self) -> str:
        return ", ".join(self.labels) or "?"


@dataclass
class Selection:
    run: FlowerRecord | None  # set when a run was asked for (all its conversations)
    targets: list[Target]


@dataclass
class _State:
    where: str
    records: list[FlowerRecord]
    rows: list[dict[str, Any]]
    steps: dict[str, str]  # lineage: step name -> session

    def live(self) -> list[FlowerRecord]:
        return [r for r in self.records if r.state == RUNNING and r.alive]


def resolve(state: RunState, what: str | None) -> Selection:
    """What ``show`` shows for ``what`` in the run ``state`` (see the module docstring);
    FlowerError if nothing."""
    st = _State(
        state.where,
        state.registry.records(),
        state.manifest_rows(),
        dict(state.peek_lineage().get("steps") or {}),
    )
    if what is None:
        return Selection(None, [_latest(st)])
    run = next((r for r in st.records if r.run == what), None)
    if run is not None:
        return Selection(run, _of_run(st, run))
    step = _step(st, what)
    if step is not None:
        return Selection(None, [step])
    if not any(r.run.startswith(what) for r in st.records):
        raise FlowerError(t("show.unknown", what=what, where=st.where), hint=t("show.unknown.hint"))
    run = find_run(state, what)  # a prefix of several runs: it says which
    return Selection(run, _of_run(st, run))


def _latest(st: _State) -> Target:
    if not st.records and not st.rows:
        raise FlowerError(t("show.none", where=st.where), hint=t("show.none.hint"))
    run = st.records[-1].run if st.records else str(st.rows[-1].get("run"))
    record = st.records[-1] if st.records else None
    if record is not None and record in st.live() and record.step and record.session_id:
        return _target(st, record.session_id, record.step)
    mine = [r for r in st.rows if r.get("run") == run and r.get("session_id")]
    if mine:
        return _target(st, str(mine[-1]["session_id"]), str(mine[-1].get("step")))
    if record is not None and record.session_id:
        return _target(st, record.session_id, record.step or "?")
    raise FlowerError(t("show.no_session", run=run), hint=t("show.no_session.hint"))


def _step(st: _State, label: str) -> Target | None:
    for r in st.live():
        if r.step == label and r.session_id:
            return _target(st, r.session_id, label)
    if label in st.steps:
        return _target(st, st.steps[label], label)
    for matches in (
        lambda row: row.get("step") == label,
        lambda row: bare_name(str(row.get("step") or "")) == label,
    ):
        found = [row for row in st.rows if matches(row) and row.get("session_id")]
        if found:
            return _target(st, str(found[-1]["session_id"]), str(found[-1]["step"]))
    return None


def _of_run(st: _State, run: FlowerRecord) -> list[Target]:
    """The run's conversations in the order it ran them, each once."""
    out: dict[str, Target] = {}
    for row in st.rows:
        sid = row.get("session_id")
        if row.get("run") != run.run or not sid:
            continue
        target = out.setdefault(sid, _target(st, sid))
        if row.get("step") not in target.labels:
            target.labels.append(str(row.get("step")))
    if run in st.live() and run.session_id:
        target = out.setdefault(run.session_id, _target(st, run.session_id))
        if run.step and run.step not in target.labels:
            target.labels.append(run.step)
    return list(out.values())


def _target(st: _State, sid: str, label: str | None = None) -> Target:
    rows = [r for r in st.rows if r.get("session_id") == sid]
    live = next((r for r in st.live() if r.session_id == sid), None)
    return Target(sid, [label] if label else [], rows, live)


# -- reading a conversation ------------------------------------------------------------


def conversation(state: RunState, session_id: str) -> list[dict[str, Any]]:
    """The turns of ``session_id``'s main transcript, in order, as plain dicts, each tool
    call paired with its result and the ledger's state of it."""
    turns = _turns(state.transcript(session_id))
    ledger = {
        r.tool_use_id: _ledger_row(r.state, r.content, r.is_error)
        for r in state.tool_calls(session_id)
    }
    return _paired(turns, ledger)


def _turns(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for entry in entries:
        kind = entry.get("type")
        message = entry.get("message")
        if kind not in ("user", "assistant") or not isinstance(message, dict):
            continue
        content = message.get("content")
        if kind == "assistant":
            out += _assistant(entry, message, content, names)
        else:
            out += _user(entry, content, names)
    return out


def _assistant(
    entry: dict[str, Any], message: dict[str, Any], content: Any, names: dict[str, str]
) -> list[dict[str, Any]]:
    if entry_is_synthetic(entry):  # the CLI's words, not the model's
        kind = "error" if entry.get("isApiErrorMessage") else "synthetic"
        return [{"role": "cli", "kind": kind, "text": _text_of(content)}]
    out: list[dict[str, Any]] = []
    for block in _blocks(content):
        bt = block.get("type")
        if bt == "text":
            out.append({"role": "assistant", "kind": "text", "text": str(block.get("text", ""))})
        elif bt == "thinking":
            text = str(block.get("thinking", ""))
            out.append({"role": "assistant", "kind": "thinking", "text": text})
        elif bt == "redacted_thinking":
            out.append({"role": "assistant", "kind": "thinking", "text": "", "redacted": True})
        elif bt in ("tool_use", "server_tool_use"):
            tid, name = str(block.get("id", "")), str(block.get("name", "?"))
            given = block.get("input")
            args: dict[str, Any] = given if isinstance(given, dict) else {}
            names[tid] = name
            out.append(
                {
                    "role": "assistant",
                    "kind": "tool_call",
                    "id": tid,
                    "tool": name,
                    "summary": summary(args),
                    "input": args,
                }
            )
        else:
            out.append({"role": "assistant", "kind": str(bt), "text": ""})
    return out


def _user(entry: dict[str, Any], content: Any, names: dict[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in _blocks(content):
        bt = block.get("type")
        if bt == "tool_result":
            tid = str(block.get("tool_use_id", ""))
            out.append(_result(tid, names.get(tid, ""), block.get("content"), block))
        elif bt == "text":
            turn = _user_text(entry, str(block.get("text")))
            if turn is not None:
                out.append(turn)
        else:
            out.append({"role": "user", "kind": str(bt), "text": ""})
    return out


def _user_text(entry: dict[str, Any], text: str) -> dict[str, Any] | None:
    """One text of a user entry: what the person (or flower) said, or what the CLI wrote
    in the user's place (role ``cli``). None for nothing but system reminders."""
    origin = entry.get("origin")
    if entry.get("isCompactSummary"):
        return {"role": "cli", "kind": "compact", "text": text}
    if entry.get("isMeta"):
        return {"role": "cli", "kind": "meta", "text": _note(text)}
    cut = cut_kind(text)
    if cut is not None:
        return {"role": "cli", "kind": "cut", "cut": cut, "text": text}
    notice = isinstance(origin, dict) and origin.get("kind") == "task-notification"
    if notice or text.lstrip().startswith("<task-notification>"):
        summary = tagged(text, "summary") or tagged(text, "status") or text
        return {"role": "cli", "kind": "notice", "text": summary}
    said, _ = reminders(text)
    name = tagged(said, "command-name")
    if name is not None:
        args = tagged(said, "command-args") or ""
        return {"role": "user", "kind": "prompt", "text": f"{name} {args}".strip()}
    command = tagged(said, "bash-input")
    if command is not None:
        return {"role": "user", "kind": "prompt", "text": f"! {command}"}
    output = [tagged(said, tag) for tag in _OUTPUT_TAGS]
    if any(x is not None for x in output):
        return {"role": "cli", "kind": "output", "text": "\n".join(x for x in output if x)}
    if not said.strip():
        return None  # only the CLI's reminders
    return {"role": "user", "kind": "prompt", "text": said}


#: Tags the CLI wraps a local command's or a ``!`` shell command's output in.
_OUTPUT_TAGS = ("local-command-stdout", "local-command-stderr", "bash-stdout", "bash-stderr")
#: Any tag, in a system note (the CLI's own text: its tags are not content).
_TAG = re.compile(r"</?[a-z][a-z0-9_-]*>")


def _note(text: str) -> str:
    """A system note (``isMeta``) readable: reminders unwrapped, the tools used before a
    summary named, tags taken out."""
    rest, held = reminders(text)
    parts = []
    for part in [*held, rest]:
        tools = tagged(part, "tools-used-before-summary")
        if tools is not None:
            parts.append(t("show.tools_used", tools=tools))
        elif part.strip():
            parts.append(_TAG.sub("", part).strip())
    return "\n".join(p for p in parts if p)


def _result(tid: str, tool: str, content: Any, block: dict[str, Any]) -> dict[str, Any]:
    text = _text_of(content)
    turn = {
        "role": "user",
        "kind": "tool_result",
        "id": tid,
        "tool": tool,
        "is_error": bool(block.get("is_error")),
        "text": readable_result(text),
    }
    cut = cut_kind(text)
    if cut is not None:  # the CLI filled the result in: the call was cut off
        turn["cut"] = cut
    return turn


def _ledger_row(state: str, content: str | None, is_error: Any) -> dict[str, Any]:
    """What show needs of a ledger row: its state, its content (parsed), its error mark."""
    try:
        value = json.loads(content) if content is not None else None
    except ValueError:
        value = content
    return {"state": state, "content": value, "is_error": bool(is_error)}


def _paired(turns: list[dict[str, Any]], ledger: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each tool result moved right under its call (parallel calls come as one message of
    calls, then one of results); a call without a result in the transcript gets the
    ledger's, or a ``pending`` turn when the call has not finished."""
    results = {x["id"]: x for x in turns if x["kind"] == "tool_result"}
    calls = {x["id"] for x in turns if x["kind"] == "tool_call"}
    out: list[dict[str, Any]] = []
    for turn in turns:
        if turn["kind"] == "tool_result" and turn["id"] in calls:
            continue  # placed under its call
        out.append(turn)
        if turn["kind"] != "tool_call":
            continue
        tid = turn["id"]
        if tid in results:
            out.append(results[tid])
            continue
        call = ledger.get(tid)
        if call and call["state"] in ("done", "failed"):
            block = {"is_error": call["is_error"] or call["state"] == "failed"}
            out.append({**_result(tid, turn["tool"], call["content"], block), "from": "ledger"})
        else:
            out.append({"role": "user", "kind": "pending", "id": tid, "tool": turn["tool"]})
    return out


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _text_of(content: Any) -> str:
    """A message's or tool result's text: a string, or its text blocks joined (an image
    or another block stands as one ``[kind]`` line)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in _blocks(content):
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            kind = str(block.get("type", "?"))
            parts.append(t("show.image") if kind == "image" else t("show.block", kind=kind))
    return "\n".join(parts)


def summary(args: dict[str, Any]) -> str:
    """A call's most telling argument: the first of flower's summary keys it has (path,
    command, pattern …), else its first short text value, else its JSON."""
    from flower.step.events import SUMMARY_KEYS  # with the result classes: for tool calls only

    for key in (*SUMMARY_KEYS, "prompt", "skill", "subject"):
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value
    for value in args.values():
        if isinstance(value, str) and value.strip():
            return value
    return json.dumps(args, ensure_ascii=False) if args else ""


# -- text ------------------------------------------------------------------------------


def render_target(target: Target, turns: list[dict[str, Any]], width: int) -> list[str]:
    lines = [t("show.header", step=target.step, session=target.session_id)]
    for row in target.rows:
        err = f"  {one_line(str(row['error']), 80)}" if row.get("error") else ""
        lines.append(
            t(
                "show.row",
                mark="+" if row.get("ok") else "x",
                step=row.get("step"),
                run=row.get("run"),
                turns=row.get("num_turns") or 0,
                cost=float(row.get("cost_usd") or 0),
                took=float(row.get("duration_s") or 0),
                error=err,
            )
        )
    if target.live is not None:
        lines.append(t("show.live", run=target.live.run, pid=target.live.pid))
    lines.append("")
    if not turns:
        lines.append(t("show.no_turns"))
    lines += render_turns(turns, width, live=target.live is not None)
    return lines


def render_turns(turns: list[dict[str, Any]], width: int, *, live: bool = False) -> list[str]:
    labels = {"user": t("show.user"), "assistant": t("show.model"), "cli": t("show.cli")}
    pad = max(cols(v) for v in labels.values()) + 2
    lines: list[str] = []
    role = None
    for turn in turns:
        body = _turn_lines(turn, max(20, width - pad), live)
        if not body:
            continue
        shown_role = "assistant" if turn["kind"] in ("tool_result", "pending") else turn["role"]
        head = ""
        if shown_role != role:
            head = labels[shown_role]
            role = shown_role
        first = head + " " * (pad - cols(head))
        lines.append(first + body[0])
        lines += [" " * pad + rest for rest in body[1:]]
    return lines


def _turn_lines(turn: dict[str, Any], width: int, live: bool) -> list[str]:
    kind = turn["kind"]
    text = str(turn.get("text") or "")
    if kind in ("text", "prompt"):
        return _wrapped(text, width)
    if kind == "tool_call":
        tool = clean(turn["tool"])
        return [f"* {tool}  {one_line(turn['summary'], min(CALL_CHARS, width - cols(tool) - 4))}"]
    if kind == "tool_result":
        cut = turn.get("cut")
        if cut == "ended":
            return ["  " + t("show.unfinished")]
        if cut:
            return ["  " + t(f"show.cut.{cut}")]
        return [_folded(turn, width)]
    if kind == "pending":
        return ["  " + t("show.running" if live else "show.unfinished")]
    if kind == "thinking":
        if turn.get("redacted"):
            return [t("show.redacted")]
        return [t("show.thinking", n=len(text))]
    if kind == "meta":
        return [f"{t('show.meta')} {one_line(text, width - 16)}".rstrip()]
    if kind == "compact":
        return [t("show.compact", n=len(text.splitlines()))]
    if kind == "error":
        return [f"! {one_line(text, width - 2)}"]
    if kind == "synthetic":
        if text.strip() == NO_RESPONSE:
            return [t("show.filler")]
        return [f"{t('show.synthetic')} {one_line(text, width - 30)}"]
    if kind == "cut":
        return [t("show.cut.turn.user" if turn.get("cut") == "user" else "show.cut.turn.ended")]
    if kind == "notice":
        return [f"{t('show.notice')} {one_line(text, width - 20)}"]
    if kind == "output":
        return [f"{t('show.output')} {one_line(text, width - 16)}"]
    return [t("show.block", kind=kind)]


def _folded(turn: dict[str, Any], width: int) -> str:
    text = clean(str(turn.get("text") or "")).strip("\n")
    lines = text.split("\n") if text else [""]
    mark = "x" if turn.get("is_error") else "->"
    more = f"  {t('show.lines', n=len(lines))}" if len(lines) > 1 else ""
    src = f"  {t('show.ledger')}" if turn.get("from") == "ledger" else ""
    room = max(20, min(RESULT_CHARS, width - 4 - cols(more) - cols(src)))
    return f"  {mark} {one_line(lines[0], room)}{more}{src}"


def _wrapped(text: str, width: int) -> list[str]:
    out: list[str] = []
    for line in clean(text).strip("\n").split("\n"):
        if cols(line) <= width:
            out.append(line)
        else:
            import textwrap  # only for a line too long to fit

            out += textwrap.wrap(line, width, break_on_hyphens=False) or [""]
    return out or [""]


def render(state: RunState, sel: Selection, width: int) -> str:
    lines: list[str] = []
    if sel.run is not None:
        r = sel.run
        run_state = state_of(r)
        lines += [t("show.run", run=r.run, flow=r.flow, state=run_state, n=len(sel.targets)), ""]
    for i, target in enumerate(sel.targets):
        if i:
            lines.append("")
        lines += render_target(target, conversation(state, target.session_id), width)
    return "\n".join(lines)


def document(state: RunState, sel: Selection) -> dict[str, Any]:
    """The ``--json`` document: one step, or a run with its steps."""
    steps = [_step_doc(state, target) for target in sel.targets]
    if sel.run is None:
        return steps[0]
    r = sel.run
    return {
        "run": r.run,
        "flow": r.flow,
        "state": state_of(r),
        "alive": r.alive,
        "steps": steps,
    }


def _step_doc(state: RunState, target: Target) -> dict[str, Any]:
    live = target.live
    return {
        "step": target.labels[0] if target.labels else None,
        "labels": target.labels,
        "session_id": target.session_id,
        "rows": [
            {k: row.get(k) for k in ("step", "run", "ok", "num_turns", "cost_usd", "duration_s")}
            | {"error": row.get("error")}
            for row in target.rows
        ],
        "live": None if live is None else {"run": live.run, "pid": live.pid, "step": live.step},
        "turns": conversation(state, target.session_id),
    }


def terminal_width() -> int:
    return line_width(MAX_WIDTH)


# -- the command -----------------------------------------------------------------------


def run(what: str | None, state: RunState, as_json: bool) -> None:
    """``flower-super show`` (declared in supervisor/cli.py, so --help imports none of this)."""
    sel = resolve(state, what)  # FlowerError: cli.py makes it one line
    if as_json:
        text = json.dumps(document(state, sel), ensure_ascii=False, indent=2)
    else:
        text = render(state, sel, terminal_width())
    echo(text)
