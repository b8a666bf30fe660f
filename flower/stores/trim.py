"""``TrimmingSessionStore``: what a resumed session is sent, trimmed by size and by value.

The middle of the three store layers (sqlite → trimming → pruning, seed 003 会话存储).
Everything happens in :meth:`TrimmingSessionStore.load`, which the SDK calls before it
spawns the CLI to resume a session: the SDK writes the entries ``load()`` returns into the
JSONL file the CLI resumes from, so they are exactly what the model is sent. SQLite keeps
every original byte (``load_sync`` still returns them); ``load()`` returns new dicts and
never mutates what the lower layer returned.

Two rules, in this order:

1. **Expiry** (:class:`EphemeralPolicy`, on by default): the result of a one-off Bash
   command (:func:`is_ephemeral`: ``git status``, ``ls``, ``cat x | wc -l`` …) at least
   ``keep_recent`` turns old is replaced by a one-line notice; the stale output is dropped,
   not spilled (the state it showed may have changed; the notice says to run it again).
   Only results of at most ``max_chars`` characters count as such glances: a longer output
   is data the model may still need, so it is left to the trimming rule, which keeps it.
2. **Trimming** (:class:`TrimPolicy`, off unless ``Runtime(trim=...)``): a tool result at
   least ``keep_recent`` turns old and longer than ``min_chars`` is written to
   ``<workspace>/.flower/spill/<sha256[:16]>.txt`` (owner-only, written once) and replaced
   by a pointer to that file plus its first ``HEAD_CHARS`` characters. Nothing is lost.

Definitions shared by both rules:

- A **turn** is one model response on the transcript's own thread: an ``assistant`` entry
  whose ``message.model`` is not ``<synthetic>`` (API-error and "No response requested."
  entries are not responses), entries sharing a ``message.id`` counted once (the CLI writes
  one entry per content block). The own thread is the main thread (``isSidechain`` false)
  of a session transcript, and the subagent's for a subagent transcript (the ``isSidechain``
  value of its first conversation entry).
- A tool result's **age** is the number of turns that start after it in the transcript:
  a result the model has answered once is 1 turn old. "Older than the ``keep_recent`` most
  recent turns" means ``age >= keep_recent``.
- Only pure-text results are rewritten (a string, or a list of text blocks): a result
  holding an ``image`` or ``document`` block is left whole. ``isCompactSummary`` entries are
  never touched. A ``tool_result`` block always stays; only its ``content`` changes (a
  missing one is the API's "Missing Tool Result Block"). Results the CLI marked as refused
  or interrupted (``toolDenialKind``, a rejecting ``permissionDecision``) are the pruning
  layer's business and are not touched here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from claude_agent_sdk.types import SessionKey, SessionStoreEntry

from ..core.fsutil import atomic_write_text, private_dir
from .sqlite import SqliteSessionStore

__all__ = [
    "HEAD_CHARS",
    "EphemeralPolicy",
    "TrimPolicy",
    "TrimmingSessionStore",
    "is_ephemeral",
    "turn_ages",
]

logger = logging.getLogger(__name__)

#: Characters of a trimmed result kept in place after the pointer (as spill_guard does).
HEAD_CHARS = 400
#: ``{cmd}`` in the expiry notice is the command on one line, cut to this many characters.
CMD_CHARS = 80
_SYNTHETIC_MODEL = "<synthetic>"

Entry = dict[str, Any]


@dataclass
class TrimPolicy:
    """Resume-time trimming of large old tool results (seed 003 defaults)."""

    keep_recent: int = 20
    min_chars: int = 2000
    spill_dirname: str = ".flower/spill"
    enabled: bool = True


@dataclass
class EphemeralPolicy:
    """Resume-time expiry of one-off Bash command results (seed 003 defaults).

    ``max_chars``: only results of at most this many characters are treated as one-off
    glances and expired; a longer one is left to :class:`TrimPolicy` (spilled, not lost).
    """

    enabled: bool = True
    keep_recent: int = 6
    max_chars: int = 2000
    text: str = "[{cmd} 的结果已过期(第 {age} 轮前),当前状态可能已变。需要请重新执行]"


# ======================================================================================
# transcript entries
# ======================================================================================


def _blocks(entry: Entry) -> list[Any] | None:
    msg = entry.get("message")
    content = msg.get("content") if isinstance(msg, dict) else None
    return content if isinstance(content, list) else None


def tool_results(entry: Entry) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, block)`` of every ``tool_result`` block of a user entry."""
    if entry.get("type") != "user":
        return
    for i, block in enumerate(_blocks(entry) or ()):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            yield i, block


def tool_uses(entry: Entry) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, block)`` of every ``tool_use`` block of an assistant entry."""
    if entry.get("type") != "assistant":
        return
    for i, block in enumerate(_blocks(entry) or ()):
        if isinstance(block, dict) and block.get("type") == "tool_use":
            yield i, block


def result_text(block: dict[str, Any]) -> str | None:
    """The text of a pure-text tool result; None if it holds anything else (images…)."""
    content = block.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    parts = []
    for item in content:
        if not isinstance(item, dict) or item.get("type") != "text":
            return None  # image / document / anything unknown: never rewritten
        parts.append(str(item.get("text", "")))
    return "\n".join(parts)


def with_result_text(entry: Entry, index: int, text: str) -> Entry:
    """A copy of ``entry`` whose content block ``index`` has ``content`` = ``text``.

    Copy on write: the entry, its message, its content list and that block are new
    objects; everything else is shared with the original, which is left as it was.
    """
    msg = dict(entry["message"])
    content = list(msg["content"])
    content[index] = {**content[index], "content": text}
    msg["content"] = content
    return {**entry, "message": msg}


def is_refused_or_interrupted(entry: Entry) -> bool:
    """Did the CLI mark this tool-result entry as refused, cancelled or interrupted?"""
    decision = entry.get("permissionDecision")
    rejected = isinstance(decision, dict) and decision.get("decision") == "reject"
    return bool(entry.get("toolDenialKind")) or rejected


def is_response(entry: Entry) -> bool:
    """An assistant entry written from a real model response (not a synthetic one)."""
    if entry.get("type") != "assistant":
        return False
    msg = entry.get("message")
    return not (isinstance(msg, dict) and msg.get("model") == _SYNTHETIC_MODEL)


def turn_ages(entries: list[Entry]) -> list[int]:
    """For each entry, how many turns of the transcript's own thread start after it."""
    own = next((bool(e.get("isSidechain")) for e in entries if e.get("uuid")), False)
    ages = [0] * len(entries)
    seen: set[str] = set()
    for i in range(len(entries) - 1, -1, -1):
        ages[i] = len(seen)
        entry = entries[i]
        if is_response(entry) and bool(entry.get("isSidechain")) == own:
            msg = entry.get("message")
            msg_id = msg.get("id") if isinstance(msg, dict) else None
            # counted at its last block: a tool result follows every block of its response
            seen.add(f"m:{msg_id}" if msg_id else f"u:{entry.get('uuid', i)}")
    return ages


def tool_use_index(entries: list[Entry]) -> dict[str, dict[str, Any]]:
    """``tool_use`` id → its block, over the whole transcript."""
    found: dict[str, dict[str, Any]] = {}
    for entry in entries:
        for _, block in tool_uses(entry):
            if isinstance(block.get("id"), str):
                found[block["id"]] = block
    return found


# ======================================================================================
# is_ephemeral: the one-off command whitelist (seed 003, shared with delegate_guard)
# ======================================================================================


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_SUBSTITUTIONS = ("$(", "`", "<(", ">(")
# Redirections that write nothing: fd duplication/closing and anything to /dev/null.
_SAFE_REDIRECT = re.compile(r"\d*>&(?:\d+|-)|(?:&>>?|\d*>>?|\d*<)\s*/dev/null(?![\w/.-])")
_BLOCKED_VERBS = {"xargs", "exec", "eval", "source", "tee"}
_FIND_ACTIONS = _words("-delete -ok -okdir -fprint -fprint0 -fprintf -fls -exec -execdir")
_GIT_DESTRUCTIVE = ("--force", "--hard", "--prune")
_GIT_BRANCH_WRITES = _words(
    "-D -d -m -M -c -C -f --delete --move --copy --force --set-upstream-to -u "
    "--unset-upstream --edit-description"
)
_AWK_WRITES = re.compile(r"system\s*\(|\bprintf?\b[^;}]*>|\|")


def is_ephemeral(cmd: str) -> bool:
    """Is ``cmd`` a one-off, read-only Bash command whose output goes stale?

    The same set decides what a coordinator may glance at itself (``delegate_guard``) and
    whose results expire on resume. Steps, in the seed's order:

    1. empty or blank → False;
    2. command substitution (``$(``, backticks, ``<(``, ``>(``) or a state-changing form
       (``xargs``/``exec``/``eval``/``source``/``tee``, ``find -delete/-ok/-fprint/-exec…``,
       ``sed -i``, ``sort -o``, awk ``system(``/``print >``/pipes, ``git branch -D/-d/-m…``,
       ``git … --force/--hard/--prune``) → False;
    3. after removing redirections that write nothing (``2>&1``, ``&> /dev/null``,
       ``>/dev/null``, ``</dev/null``), any unquoted ``>`` or ``<`` left → False;
    4. after removing ``&&`` and ``||``, an unquoted ``&`` left (a background job) → False;
    5. split on ``&&`` / ``||`` / ``;`` / ``|`` / newlines: every segment must be a
       whitelisted read-only command (:data:`_VERBS`), with its arguments checked where a
       whitelisted verb can also write (``git``, ``env``, ``date``, ``uniq``, ``sed`` …).

    Unbalanced quotes make the command unreadable, hence False. Leading ``VAR=value``
    assignments and ``cd`` are not whitelisted (both change state of the tool's shell).
    """
    if not cmd or not cmd.strip():  # 1
        return False
    if any(s in cmd for s in _SUBSTITUTIONS):  # 2
        return False
    raw = _argvs(cmd)
    if raw is None or any(_blocked_form(argv) for argv in raw):
        return False
    text = _SAFE_REDIRECT.sub(" ", cmd)
    plain = _unquoted(text)
    if plain is None or "<" in plain or ">" in plain:  # 3
        return False
    if "&" in plain.replace("&&", "").replace("||", ""):  # 4
        return False
    argvs = _argvs(text)  # 5
    return bool(argvs) and all(_whitelisted(argv) for argv in argvs)


def _scan(text: str) -> Iterator[tuple[str, bool]]:
    """``(char, quoted)`` for each character, quotes and backslash escapes understood.

    Raises ValueError on an unterminated quote or a trailing backslash.
    """
    quote = ""
    chars = iter(text)
    for ch in chars:
        if quote == "'":
            quote = "" if ch == "'" else quote
            yield ch, True
        elif ch == "\\":
            nxt = next(chars, None)
            if nxt is None:
                raise ValueError("trailing backslash")
            yield ch, True
            yield nxt, True
        elif quote == '"':
            quote = "" if ch == '"' else quote
            yield ch, True
        elif ch in "'\"":
            quote = ch
            yield ch, True
        else:
            yield ch, False
    if quote:
        raise ValueError("unterminated quote")


def _unquoted(text: str) -> str | None:
    """``text`` with every quoted character blanked out; None if it cannot be read."""
    try:
        return "".join(" " if quoted else ch for ch, quoted in _scan(text))
    except ValueError:
        return None


def _segments(text: str) -> list[str] | None:
    """Split on unquoted ``&&``, ``||``, ``|``, ``;`` and newlines; None if unreadable."""
    try:
        scanned = list(_scan(text))
    except ValueError:
        return None
    parts, cur, i = [], [], 0
    while i < len(scanned):
        ch, quoted = scanned[i]
        pair = ch + (scanned[i + 1][0] if i + 1 < len(scanned) else "")
        if not quoted and pair in ("&&", "||"):
            parts.append("".join(cur))
            cur, i = [], i + 2
            continue
        if not quoted and ch in "|;\n":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def _argvs(text: str) -> list[list[str]] | None:
    """The argument vector of each segment; None if any cannot be tokenised."""
    segments = _segments(text)
    if segments is None:
        return None
    try:
        return [shlex.split(seg) for seg in segments]
    except ValueError:
        return None


def _blocked_form(argv: list[str]) -> bool:
    """Step 2: a whitelisted-looking verb used in a way that changes state."""
    if not argv:
        return False
    verb, args = argv[0], argv[1:]
    if verb in _BLOCKED_VERBS:
        return True
    if verb == "find":
        return any(a in _FIND_ACTIONS for a in args)
    if verb in ("sed", "gsed"):
        return any(re.match(r"-[A-Za-z]*i", a) or a.startswith("--in-place") for a in args)
    if verb == "sort":
        return any(re.match(r"-[A-Za-z]*o", a) or a.startswith("--output") for a in args)
    if verb in ("awk", "gawk", "mawk", "nawk"):
        return any(_AWK_WRITES.search(a) for a in args)
    if verb == "git":
        if any(a.startswith(_GIT_DESTRUCTIVE) for a in args):
            return True
        return "branch" in args and any(a.split("=")[0] in _GIT_BRANCH_WRITES for a in args)
    return False


def _whitelisted(argv: list[str]) -> bool:
    """Step 5: one segment is a read-only command of the whitelist."""
    if not argv or "=" in argv[0]:
        return False
    check = _VERBS.get(argv[0])
    return check is not None and check(argv[1:])


def _any(args: list[str]) -> bool:
    return True


def _no_positional(args: list[str]) -> bool:
    return all(a.startswith("-") for a in args)


def _date(args: list[str]) -> bool:  # `date -s X` and `date MMDDhhmm` set the clock
    return not any(
        re.match(r"-[A-Za-z]*s", a) or a.startswith("--set") or re.fullmatch(r"[\d.]+", a)
        for a in args
    )


def _env(args: list[str]) -> bool:  # `env X=1 cmd` runs cmd
    return all(a in ("-0", "--null") for a in args)


def _command(args: list[str]) -> bool:  # `command rm x` runs rm
    return bool(args) and args[0] in ("-v", "-V")


def _uniq(args: list[str]) -> bool:  # `uniq IN OUT` writes OUT
    positional, skip = 0, False
    for a in args:
        if skip:
            skip = False
        elif a in ("-f", "-s", "-w"):
            skip = True
        elif not a.startswith("-") or a == "-":
            positional += 1
    return positional <= 1


def _tree(args: list[str]) -> bool:  # -o writes a file, -R writes one per directory
    return not any(a in ("-o", "-R") or a.startswith("--output") for a in args)


def _rg(args: list[str]) -> bool:  # --pre runs a command on every file
    return not any(a.startswith("--pre") and not a.startswith("--pretty") for a in args)


def _awk(args: list[str]) -> bool:  # a program file cannot be checked
    return not any(a in ("-f", "--file") or a.startswith("--file=") for a in args)


# A sed script is accepted only when made of printing/selecting commands and s/y without
# the w or e flags: addresses (N, $, /re/), ranges, `!`, then p P d D n N g G h H x l = z
# q Q, s<d>…<d>…<d>[gpiIN] or y<d>…<d>…<d>; commands separated by ; or newlines.
_SED_ADDR = r"(?:\d+|\$|/(?:[^/\\\n]|\\.)*/[IM]?)(?:~\d+)?"
_SED_RANGE = rf"(?:{_SED_ADDR}(?:\s*,\s*(?:{_SED_ADDR}|[+~]\d+))?)?\s*!?\s*"
_SED_PART = r"(?:(?!\2)[^\\\n]|\\.)*"
_SED_ONE = (
    rf"{_SED_RANGE}(?:[pPdDnNgGhHxl=z]|[qQ]\d*"
    rf"|(?P<sy>[sy])([/|#,:@!]){_SED_PART}\2{_SED_PART}\2[gpiI0-9]*)"
)
_SED_SINGLE = re.compile(rf"\s*{_SED_ONE}\s*")


def _sed_script_ok(script: str) -> bool:
    commands = _sed_commands(script)
    return bool(commands) and all(_SED_SINGLE.fullmatch(c) for c in commands)


def _sed_commands(script: str) -> list[str]:
    """Split a sed script into commands at ``;``/newlines outside s///-style arguments."""
    out, cur, i = [], "", 0
    while i < len(script):
        ch = script[i]
        if ch in "sy" and (not cur.strip() or re.fullmatch(_SED_RANGE, cur)):
            delim = script[i + 1 : i + 2]
            end = _sed_skip(script, i + 2, delim, 2) if delim else len(script)
            cur += script[i:end]
            i = end
            continue
        if ch in ";\n":
            out.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    out.append(cur)
    return [c for c in out if c.strip()]


def _sed_skip(script: str, i: int, delim: str, count: int) -> int:
    """Index just past ``count`` more unescaped ``delim`` characters from ``i``."""
    while i < len(script) and count:
        if script[i] == "\\":
            i += 2
            continue
        count -= script[i] == delim
        i += 1
    return i


def _sed(args: list[str]) -> bool:
    scripts, files, i = [], 0, 0
    while i < len(args):
        a = args[i]
        if a in ("-e", "--expression"):
            if i + 1 >= len(args):
                return False
            scripts.append(args[i + 1])
            i += 2
            continue
        if a.startswith("--expression="):
            scripts.append(a.split("=", 1)[1])
        elif a in ("-f", "--file") or a.startswith("--file="):
            return False  # a script file cannot be checked
        elif a in ("-l", "--line-length"):
            i += 1
        elif a.startswith("-") and a != "-":
            pass
        else:
            files += 1
            if not scripts and files == 1:
                scripts.append(a)
        i += 1
    return bool(scripts) and all(_sed_script_ok(s) for s in scripts)


_GIT_READ = _words(
    "status diff log show rev-parse ls-files ls-tree blame describe shortlog cat-file "
    "rev-list show-ref merge-base name-rev for-each-ref grep whatchanged count-objects "
    "ls-remote var help version check-ignore check-attr diff-tree diff-files diff-index "
    "show-branch cherry"
)
_GIT_GLOBAL_FLAGS = _words(
    "--no-pager -P --bare --no-replace-objects --literal-pathspecs --no-optional-locks"
)
_GIT_LIST_MODE = _words("-l --list --contains --no-contains --merged --no-merged --points-at")
_GIT_LIST_FLAGS = _GIT_LIST_MODE | _words(
    "-a --all -r --remotes -v -vv --verbose --show-current --sort --format --color "
    "--no-color --column --no-column -i --ignore-case --abbrev --no-abbrev -n"
)


def _git(args: list[str]) -> bool:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        a = args[i]
        if a == "-C":
            i += 2
            continue
        if a in ("--version", "--help") and i == len(args) - 1:
            return True
        if a not in _GIT_GLOBAL_FLAGS and not a.startswith(("--git-dir=", "--work-tree=")):
            return False  # -c can set core.pager, aliases…: anything may run
        i += 1
    if i >= len(args):
        return False
    sub, rest = args[i], args[i + 1 :]
    if any(
        a.startswith(("--output", "--ext-diff", "--open-files-in-pager")) or a == "-O" for a in rest
    ):
        return False
    if sub in _GIT_READ:
        return True
    check = _GIT_RESTRICTED.get(sub)
    return check is not None and check(rest)


def _git_listing(rest: list[str]) -> bool:
    """``git branch`` / ``git tag`` only list: known flags, names only with a list mode."""
    flags = [a.split("=")[0] for a in rest if a.startswith("-")]
    if any(f not in _GIT_LIST_FLAGS and not re.fullmatch(r"-n\d+", f) for f in flags):
        return False
    positional = [a for a in rest if not a.startswith("-")]
    return not positional or any(f in _GIT_LIST_MODE for f in flags)


def _first_in(allowed: set[str], *, bare: bool) -> Callable[[list[str]], bool]:
    def check(rest: list[str]) -> bool:
        return (bare and not rest) or (bool(rest) and rest[0] in allowed)

    return check


def _git_config(rest: list[str]) -> bool:
    reads = {"--get", "--get-all", "--get-regexp", "--get-urlmatch", "--list", "-l"}
    return (
        bool(rest)
        and (rest[0] in ("get", "list") or any(a in reads for a in rest))
        and not any(
            a.startswith(
                (
                    "--unset",
                    "--add",
                    "--replace-all",
                    "--rename-section",
                    "--remove-section",
                    "--edit",
                    "-e",
                )
            )
            for a in rest
        )
    )


_GIT_RESTRICTED: dict[str, Callable[[list[str]], bool]] = {
    "branch": _git_listing,
    "tag": _git_listing,
    "remote": lambda r: not r or r in (["-v"], ["--verbose"]) or r[0] in ("show", "get-url"),
    "config": _git_config,
    "stash": _first_in({"list", "show"}, bare=False),
    "reflog": lambda r: not r or r[0] == "show" or r[0].startswith("-"),
    "worktree": _first_in({"list"}, bare=False),
    "submodule": _first_in({"status", "summary"}, bare=True),
    "notes": _first_in({"list", "show"}, bare=False),
}

_DOCKER_READ = {"ps", "images", "logs", "inspect", "version", "info", "top", "port", "stats"}
_KUBECTL_READ = _words(
    "get describe logs top version explain api-resources api-versions cluster-info"
)
_KUBECTL_VALUE_FLAGS = _words("-n --namespace --context --kubeconfig --cluster --user -s --server")


def _docker(args: list[str]) -> bool:
    return bool(args) and args[0] in _DOCKER_READ


def _kubectl(args: list[str]) -> bool:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in _KUBECTL_VALUE_FLAGS else 1
    if i >= len(args):
        return False
    sub, rest = args[i], args[i + 1 :]
    if sub == "config":
        return bool(rest) and rest[0] in ("view", "get-contexts", "current-context")
    return sub in _KUBECTL_READ


#: verb → check of its arguments (step 5). Grouped as the seed groups them.
_VERBS: dict[str, Callable[[list[str]], bool]] = {
    "git": _git,
    # directories and system information
    **dict.fromkeys(
        _words(
            "ls pwd df du whoami id uname uptime free nproc printenv echo true basename "
            "dirname realpath readlink file"
        ),
        _any,
    ),
    "date": _date,
    "env": _env,
    "hostname": _no_positional,
    # processes and containers
    **dict.fromkeys(["ps", "top", "lsof", "pgrep"], _any),
    "docker": _docker,
    "kubectl": _kubectl,
    # looking at files
    **dict.fromkeys(["cat", "head", "tail", "wc", "stat", "find"], _any),
    "tree": _tree,
    # finding programs
    **dict.fromkeys(["which", "whereis", "type"], _any),
    "command": _command,
    # text processing
    **dict.fromkeys(
        _words(
            "grep egrep fgrep sort cut tr column nl comm cmp diff jq md5sum sha1sum "
            "sha256sum xxd od"
        ),
        _any,
    ),
    "rg": _rg,
    "uniq": _uniq,
    "awk": _awk,
    "gawk": _awk,
    "mawk": _awk,
    "nawk": _awk,
    "sed": _sed,
    "gsed": _sed,
}


# ======================================================================================
# the store
# ======================================================================================


class TrimmingSessionStore(SqliteSessionStore):
    """``SqliteSessionStore`` whose ``load()`` expires one-off results and trims big ones.

    ``workspace`` is where spill files go (``<workspace>/<policy.spill_dirname>``).
    ``policy`` defaults to ``TrimPolicy()``, ``ephemeral`` to ``EphemeralPolicy()``; a
    policy with ``enabled=False`` skips its rule entirely. ``last_report`` counts what the
    most recent ``load()`` did, per rule (``expired``, ``trimmed``; ``trim_failed`` when a
    spill file could not be written, in which case that result is left whole). The SDK
    loads a session's subagent transcripts after its main one, so after a resume it
    describes the last transcript loaded.
    """

    def __init__(
        self,
        path: str | Path,
        workspace: str | Path,
        policy: TrimPolicy | None = None,
        ephemeral: EphemeralPolicy | None = None,
    ) -> None:
        super().__init__(path)
        self.workspace = Path(workspace).absolute()  # spill pointers must work from any cwd
        self.policy = policy if policy is not None else TrimPolicy()
        self.ephemeral = ephemeral if ephemeral is not None else EphemeralPolicy()
        self.last_report: dict[str, int] = {}

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """The stored entries of ``key`` as the model should see them on resume."""
        entries = await super().load(key)
        self.last_report = {}
        if entries is None:
            return None
        # Spill files are written here: keep the file I/O off the event loop.
        return await asyncio.to_thread(self.reshape, entries)

    def reshape(self, entries: list[Entry]) -> list[Entry]:
        """Apply this layer's rules to raw entries (what ``load()`` does after reading).

        Returns a new list; changed entries are new dicts, ``entries`` is not modified.
        """
        self.last_report = {}
        out = list(entries)
        if self.ephemeral.enabled:
            out = self.expire(out)
        if self.policy.enabled:
            out = self.trim(out)
        return out

    def expire(self, entries: list[Entry]) -> list[Entry]:
        """Replace old one-off Bash results with the ephemeral policy's notice."""
        pol, uses, ages = self.ephemeral, tool_use_index(entries), turn_ages(entries)
        out, count = list(entries), 0
        for n, entry in enumerate(entries):
            if entry.get("isCompactSummary") or is_refused_or_interrupted(entry):
                continue
            for i, block in tool_results(entry):
                cmd = _ephemeral_command(uses.get(block.get("tool_use_id", "")))
                text = result_text(block)
                if cmd is None or text is None or ages[n] < pol.keep_recent:
                    continue
                if len(text) > pol.max_chars:
                    continue  # not a glance: the trimming rule keeps its content
                notice = pol.text.format(cmd=_short(cmd), age=ages[n])
                out[n] = with_result_text(out[n], i, notice)
                count += 1
        self.last_report["expired"] = count
        return out

    def trim(self, entries: list[Entry]) -> list[Entry]:
        """Spill old large text results to files, leaving a pointer and a head."""
        pol, ages = self.policy, turn_ages(entries)
        out, trimmed, failed = list(entries), 0, 0
        for n, entry in enumerate(entries):
            if entry.get("isCompactSummary") or is_refused_or_interrupted(entry):
                continue
            if ages[n] < pol.keep_recent:
                continue
            for i, block in tool_results(entry):
                text = result_text(block)
                if text is None or len(text) <= pol.min_chars:
                    continue
                pointer = _pointer(text, self.spill_path(text))
                if len(pointer) >= len(text):  # a small min_chars: nothing to gain
                    continue
                try:
                    self.spill(text)
                except (OSError, UnicodeError) as exc:  # lone surrogates cannot be written
                    logger.warning("could not spill a tool result (%s); kept whole", exc)
                    failed += 1
                    continue
                out[n] = with_result_text(out[n], i, pointer)
                trimmed += 1
        self.last_report["trimmed"] = trimmed
        if failed:
            self.last_report["trim_failed"] = failed
        return out

    def spill_path(self, text: str) -> Path:
        """Where ``text`` is spilled: named by its content hash, so written once."""
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        return self.workspace / self.policy.spill_dirname / f"{digest}.txt"

    def spill(self, text: str) -> Path:
        """Write ``text`` to its spill file (owner-only) unless it is there; return the path."""
        path = self.spill_path(text)
        private_dir(path.parent)
        if not path.exists():
            atomic_write_text(path, text)
        return path


def _ephemeral_command(use: dict[str, Any] | None) -> str | None:
    """The command of a foreground Bash call that :func:`is_ephemeral` accepts."""
    if use is None or use.get("name") != "Bash":
        return None
    args = use.get("input")
    if not isinstance(args, dict) or args.get("run_in_background"):
        return None
    cmd = args.get("command")
    return cmd if isinstance(cmd, str) and is_ephemeral(cmd) else None


def _short(cmd: str) -> str:
    one_line = " ".join(cmd.split())
    return one_line if len(one_line) <= CMD_CHARS else one_line[: CMD_CHARS - 1] + "…"


def _pointer(text: str, path: Path) -> str:
    head = text[:HEAD_CHARS]
    return (
        f"[这段工具结果共 {len(text)} 字符,已移到 {path},内容没丢,需要时用 Read 读取。"
        f"下面是开头 {len(head)} 字符]\n{head}"
    )
