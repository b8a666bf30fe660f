"""``is_ephemeral``: is this Bash command a one-off glance (seed 003)?

One function decides two things that must stay equal: which commands a delegate-only
coordinator may run itself (delegate_guard's glance), and which Bash results expire when a
session is resumed (the trimming layer). Allowing without expiring leaves a stale
``git status`` in the context for good; expiring without allowing makes the coordinator
send a subagent (~4.3K tokens to start) for one ``ls``.

The order of checks (seed 003): empty → False; command substitution or a state-changing
form → False; after removing harmless redirections any ``>``/``<`` left → False; a lone
``&`` (background) → False; then every segment split on ``&&``/``||``/``;``/``|`` must be a
whitelisted verb whose arguments are read-only.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator

__all__ = ["is_ephemeral"]


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
    return argvs is not None and bool(argvs) and all(_whitelisted(argv) for argv in argvs)


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
    parts: list[str] = []
    cur: list[str] = []
    i = 0
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
