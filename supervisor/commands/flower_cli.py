"""``flower``: the command a person types. ``flower "帮我做一个 X"``, later ``flower``.

Four subcommands: ``go`` (the default: the starter flow 确认需求 → 设定目标 → 干活), ``run
TARGET`` (a flow of your own), ``once PROMPT`` (one agent, once) and ``setup`` (credentials).
``go`` and ``run`` run under the supervisor exactly as ``flower-super start`` does (one child
process per step attempt and per judge round; the same signals, manifest rows and resume):
both call :func:`supervisor.run.start.run_start`.

The argv is first given its default subcommand (:func:`with_default_cmd`): the first token
that is not a global flag (or a global flag's value) names the subcommand when it is one,
and is the request of ``go`` otherwise. ``setup`` is a subcommand here (the original's
``flower setup`` was rewritten into a run whose request was the word "setup").

Exit status: 0 done; 1 every deliberate stop (one line on stderr, no traceback); 2 a usage
mistake (argparse's own line); 130 Ctrl-C twice during a run.

This module is imported by ``flower --help``: it imports nothing heavy at module level.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from flower.i18n import define, t
from supervisor.inspect.runstate import START_WAIT_S, Choice, choose, open_chosen, starting, warn

CMDS = ("go", "run", "once", "setup")
PERMISSION_MODES = ("default", "acceptEdits", "plan", "bypassPermissions")
ONCE_TOOLS = "Read,Glob,Grep"

define(
    {
        "cli.once_placement.hint": (
            "去掉 --placement;要在集群上跑,写一个流程:flower run flows.py:main --placement …",
            "leave --placement out; to run on a cluster, write a flow: flower run flows.py:main "
            "--placement …",
        ),
        "cli.once_placement": (
            "flower once 只在本机跑一个 agent,不用 --placement"
            "(流程才放到集群上:flower / flower run)",
            "flower once runs one agent here; --placement is for flows (flower, flower run)",
        ),
        # help texts
        "cli.description": (
            "flower:一句话开跑,断了再跑一次就接着做。不写子命令时就是 go。",
            "flower: say what you want done in one sentence; run it again later and it "
            "carries on. Without a subcommand it is `go`.",
        ),
        "cli.epilog": (
            '例子:flower "帮我做一个 X" · flower(接着上次)· flower --new "另一件事" · '
            'flower run flows.py:main · flower once "读一眼这个仓库" · flower setup\n'
            "退出码:0 完成;1 有意停下(一行说明);2 参数错误;130 运行中连按两次 Ctrl-C。",
            'examples: flower "build me an X" · flower (carry on) · flower --new "something '
            'else" · flower run flows.py:main · flower once "read this repo" · flower setup\n'
            "exit status: 0 done; 1 a deliberate stop (one line says why); 2 a usage mistake; "
            "130 Ctrl-C twice during a run.",
        ),
        "cli.help.go": (
            "一键跑:问清需求 → 派人干活(不写子命令时的默认)",
            "the whole chain: clarify the request, set a goal, work, judge each round "
            "(the default)",
        ),
        "cli.help.run": (
            "运行一个 workflow",
            "run a workflow of your own (MODULE:ATTR or FILE.py:ATTR)",
        ),
        "cli.help.once": ("跑一次单 agent", "run one agent once: no workflow, no verdict"),
        "cli.help.setup": (
            "配置凭证(API key / 网关 / 模型),写到 ~/.config/flower/.env",
            "configure credentials (API key / gateway / model), written to ~/.config/flower/.env",
        ),
        "cli.help.workspace": (
            "agent 干活的目录(默认当前目录;没有就建)",
            "the directory the agents work in (default: the current one; created if missing)",
        ),
        "cli.help.run_dir": (
            "会话库和运行清单的目录(默认 runs,相对当前目录,不是相对工作区)",
            "where sessions.db and manifest.json live (default runs, relative to the current "
            "directory, not to the workspace)",
        ),
        "cli.help.verbose": (
            "多打印:subagent 的正文、工具结果、生效的凭证配置(token 只露前 4 位)",
            "print more: subagents' text, tool results, the credentials in effect (a token "
            "shows its first 4 characters only)",
        ),
        "cli.help.workbench": (
            "开工作台(run / once 用;go 总有自己的工作台)",
            "enable the workbench (for run and once; go always has its own)",
        ),
        "cli.help.trim": (
            "续跑时把旧的大工具结果换成文件指针(run / once 用;go 默认就开,--no-trim 关)",
            "on resume, replace large old tool results with file pointers (for run and "
            "once; go trims by default, --no-trim turns it off)",
        ),
        "cli.help.ask": ("要做的事,一句话", "what you want done, in one sentence"),
        "cli.help.asks": (
            "提问额度:负数 = 不限(默认);0 = 不许问",
            "question quota: negative = unlimited (default); 0 = no questions",
        ),
        "cli.help.rounds": (
            "干活的总轮数,每轮结束由独立判定者判一次(0 和 1 都是一轮)",
            "work rounds in all, each judged by an independent judge (0 and 1 both mean one)",
        ),
        "cli.help.no_goal": (
            "不设目标、不判定:干活步骤做完就结束",
            "no goal and no judge: the run is done when the work step is",
        ),
        "cli.help.judge_can_run": (
            "让判定者能跑命令(判得更严,但它也能改工作区)",
            "let the judge run commands (a tougher verdict, but it can change the workspace)",
        ),
        "cli.help.timeout": (
            "等人回答的秒数;0 或负数 = 全自动,提问立刻落空,由它自己判断",
            "seconds a question waits for you; 0 or negative = unattended, every question "
            "falls through at once and the agent decides",
        ),
        "cli.help.isolate": (
            "每个 subagent 一份 git worktree(要求工作区是 git 仓库;工作台移到仓库外)",
            "give each subagent its own git worktree (the workspace must be a git repo; the "
            "workbench moves outside it)",
        ),
        "cli.help.window": (
            "模型上下文窗口(token);不给或 0 = 按模型名推断;到 窗口-50000 写交接书换代",
            "the model's context window in tokens; omitted or 0 = inferred from the model "
            "name; at window-50000 a handoff is written and a new session takes over",
        ),
        "cli.help.no_handoff": (
            "关掉换代,退回 SDK 自己的压缩",
            "no handoff: fall back to the SDK's own compaction",
        ),
        "cli.help.new": (
            "不接着上次:把上一段的 lineage.json、需求.md、目标.md 移进 "
            "notes/archive/<时间>/ 再重开",
            "do not carry on: move the last thread's lineage.json and its frozen brief and "
            "goal into notes/archive/<time>/ and start afresh",
        ),
        "cli.help.clarify_only": (
            "只确认需求,不干活",
            "only clarify the request (the first step), no work",
        ),
        "cli.help.no_trim": (
            "续跑时不裁剪旧的大工具结果(go 默认裁剪)",
            "do not trim large old tool results on resume (go trims by default)",
        ),
        "cli.help.go_epilog": (
            "全局开关(-w/-r/-v/-W/-T/--state/--placement)见 `flower --help`",
            "global flags (-w/-r/-v/-W/-T/--state/--placement): see `flower --help`",
        ),
        "cli.help.target": (
            "模块:属性 或 文件.py:属性,指向一个 Workflow(或返回 Workflow 的函数)",
            "MODULE:ATTR or FILE.py:ATTR naming a Workflow (or a function returning one)",
        ),
        "cli.help.verify": (
            "只检查流程(每处问题一行,退出码 2),不跑",
            "only check the flow (one line per problem, exit status 2); do not run it",
        ),
        "cli.verified": (
            "流程 '{flow}' 没问题:{n} 个步骤",
            "flow '{flow}' is valid: {n} {n|step|steps}",
        ),
        "cli.help.prompt": ("给这个 agent 的话", "what to tell the agent"),
        "cli.help.instructions": (
            "领域说明,叠加在 Claude Code 自带的系统提示之后",
            "domain instructions, appended after Claude Code's own system prompt",
        ),
        "cli.help.tools": (
            "逗号分隔的工具白名单(默认 Read,Glob,Grep)",
            "comma-separated tool allowlist (default Read,Glob,Grep)",
        ),
        "cli.help.permission_mode": ("权限模式", "permission mode"),
        "cli.help.budget": ("花费上限(美元),超了就停", "cost cap in dollars; it stops past it"),
        "cli.help.resume": ("接着一条已有的会话", "continue an existing session"),
        "cli.help.fork": ("和 --resume 一起用:分叉而不是接着", "with --resume: fork it instead"),
        "cli.bad_window": (
            "--window 要是正数(0 = 按模型名推断),给的是 {value}",
            "--window must be positive (0 = inferred from the model name), got {value}",
        ),
        # the startup prompt
        "cli.prompt.first": (
            "要做什么? 一句话就够,回车开始(Ctrl-C 退出)",
            "What do you want done? One sentence is enough; Enter starts (Ctrl-C quits)",
        ),
        "cli.prompt.wake": (
            "接着上次? 直接回车 = 接着做;也可以说点新的;/new = 重开一件事(Ctrl-C 退出)",
            "Carry on from last time? Enter = carry on; or say something new; /new = start "
            "something else (Ctrl-C quits)",
        ),
        "cli.cancelled": ("已取消", "cancelled"),
        "cli.empty_first": (
            '诉求是空的。直接 `flower` 然后按提示输入,或者 flower "帮我做一个 X"。',
            'The request is empty. Run `flower` and type it at the prompt, or flower "build '
            'me an X".',
        ),
        "cli.no_ask": (
            "要给一句诉求,例如 flower '帮我做一个 X'",
            "say what you want done, e.g. flower 'build me an X'",
        ),
        "cli.not_git": (
            "--isolate 要求 {ws} 是 git 仓库(每个 subagent 要分一份 worktree)。先 git init,"
            "或者去掉 --isolate。",
            "--isolate needs {ws} to be a git repository (each subagent gets its own "
            "worktree). Run git init first, or drop --isolate.",
        ),
        "cli.piped": (
            "! 标准输入不是终端,没人能回答提问。想让它自己判断就加 --timeout 0",
            "! stdin is not a terminal: nobody can answer questions. Add --timeout 0 to let "
            "it decide for itself",
        ),
        "cli.new_needs_ask": (
            '--new 是重开一件事,要说是什么事,例如 flower --new "另一件事"',
            '--new starts something else: say what, e.g. flower --new "something else"',
        ),
        "cli.hint": ("  提示:{hint}", "  hint: {hint}"),  # as supervisor/cli.py has it
        "cli.usage": ("用法:", "usage: "),
        "cli.positionals": ("参数", "positional arguments"),
        "cli.optionals": ("选项", "options"),
        "cli.commands": ("子命令", "subcommands"),
        "cli.help.help": ("显示这段帮助然后退出", "show this help and exit"),
        "cli.help.version": ("显示版本然后退出", "show the version and exit"),
        "cli.usage_error": ("{prog}:参数不对:{message}", "{prog}: error: {message}"),
        "cli.no_cmd": ("缺了子命令或诉求", "a subcommand or a request is missing"),
        # argparse's own error messages, in the person's language (see _argparse_says)
        "cli.arg.required": (
            "缺了这些参数:{names}",
            "the following arguments are required: {names}",
        ),
        "cli.arg.unknown": ("不认识这些参数:{names}", "unrecognized arguments: {names}"),
        "cli.arg.ambiguous": (
            "{option} 有歧义,可能是 {matches}",
            "ambiguous option: {option} could match {matches}",
        ),
        "cli.arg.of": ("参数 {name}:{message}", "argument {name}: {message}"),
        "cli.arg.one": ("后面要跟一个值", "expected one argument"),
        "cli.arg.choice": (
            "{value} 不是可选的值(可选:{choices})",
            "invalid choice: {value} (choose from {choices})",
        ),
        "cli.arg.int": ("{value} 不是整数", "{value} is not a whole number"),
        "cli.arg.float": ("{value} 不是数字", "{value} is not a number"),
        "cli.once.done": (
            "{mark} ad-hoc  用时 {elapsed} · 花费 ${cost:.4f} · 会话 {session}",
            "{mark} ad-hoc  took {elapsed} · cost ${cost:.4f} · session {session}",
        ),
        "cli.once.failed": ("x ad-hoc 没跑成:{error}", "x ad-hoc failed: {error}"),
    }
)


class Stop(Exception):
    """A deliberate stop: ``message`` on stderr (and its hint), exit status ``code``."""

    def __init__(self, message: str, code: int = 1, hint: str = "") -> None:
        super().__init__(message)
        self.message, self.code, self.hint = message, code, hint


# -- the parser -------------------------------------------------------------------------


def _globals(p: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The seven global flags; on a subparser their defaults are SUPPRESS, so they may come
    before or after the subcommand without one copy overwriting the other."""

    def d(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    p.add_argument("-w", "--workspace", default=d("."), help=t("cli.help.workspace"))
    p.add_argument("-r", "--run-dir", default=d("runs"), help=t("cli.help.run_dir"))
    p.add_argument(
        "-v", "--verbose", action="store_true", default=d(False), help=t("cli.help.verbose")
    )
    p.add_argument(
        "-W", "--workbench", action="store_true", default=d(False), help=t("cli.help.workbench")
    )
    p.add_argument("-T", "--trim", action="store_true", default=d(False), help=t("cli.help.trim"))
    state_help = f"{t('state.help.option')} {t('state.help.where')}"
    p.add_argument("--state", default=d(None), metavar="URL", help=state_help)
    p.add_argument(
        "--placement",
        default=d(None),
        metavar="temporal://HOST:PORT/QUEUE",
        help=t("state.help.placement"),
    )


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's help, with its own words ("usage:") in the person's language."""

    def add_usage(self, usage: Any, actions: Any, groups: Any, prefix: str | None = None) -> None:
        super().add_usage(usage, actions, groups, prefix if prefix is not None else t("cli.usage"))


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose section titles, -h and error line speak the catalogue."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        kwargs["add_help"] = False
        super().__init__(*args, **kwargs)
        self._positionals.title = t("cli.positionals")
        self._optionals.title = t("cli.optionals")
        self.add_argument(
            "-h", "--help", action="help", default=argparse.SUPPRESS, help=t("cli.help.help")
        )

    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        self.exit(2, t("cli.usage_error", prog=self.prog, message=_argparse_says(message)) + "\n")


# argparse words its errors in English (gettext, with no catalogue of ours to hook into):
# each one a person can cause here, matched and said again through the catalogue (patterns
# compiled at their first use, by re's cache: `flower --help` never needs them).
_ARGPARSE = [
    (r"the following arguments are required: (?P<names>.+)", "cli.arg.required"),
    (r"unrecognized arguments: (?P<names>.+)", "cli.arg.unknown"),
    (
        r"ambiguous option: (?P<option>\S+) could match (?P<matches>.+)",
        "cli.arg.ambiguous",
    ),
    (r"expected one argument", "cli.arg.one"),
    (
        r"invalid choice: (?P<value>.+) \(choose from (?P<choices>.+)\)",
        "cli.arg.choice",
    ),
    (r"invalid int value: (?P<value>.+)", "cli.arg.int"),
    (r"invalid float value: (?P<value>.+)", "cli.arg.float"),
]
_ARGUMENT = r"(?s)argument (?P<name>[^:]+): (?P<message>.+)"


def _argparse_says(message: str) -> str:
    """argparse's error ``message`` in the person's language (as it is when unknown)."""
    of = re.fullmatch(_ARGUMENT, message)
    if of:
        return t("cli.arg.of", name=of["name"], message=_argparse_says(of["message"]))
    for pattern, key in _ARGPARSE:
        m = re.fullmatch(pattern, message)
        if m:
            return t(key, **m.groupdict()) if m.groupdict() else t(key)
    return message


def build_parser() -> argparse.ArgumentParser:
    """The parser, its help in the person's language (built per call: the catalogue picks
    the language when it is asked)."""
    from flower import __version__

    main = _Parser(prog="flower", description=t("cli.description"), epilog=t("cli.epilog"))
    _globals(main, suppress=False)
    main.add_argument(
        "--version",
        action="version",
        version=f"flower {__version__}",
        help=t("cli.help.version"),
    )
    sub = main.add_subparsers(
        dest="cmd", metavar="{go,run,once,setup}", parser_class=_Parser, title=t("cli.commands")
    )

    go = sub.add_parser(
        "go",
        help=t("cli.help.go"),
        description=t("cli.help.go"),
        epilog=t("cli.help.go_epilog"),
    )
    _globals(go, suppress=True)
    go.add_argument("ask", nargs="?", default=None, help=t("cli.help.ask"))
    go.add_argument("--asks", type=int, default=-1, metavar="N", help=t("cli.help.asks"))
    go.add_argument("--rounds", type=int, default=3, metavar="N", help=t("cli.help.rounds"))
    go.add_argument("--no-goal", action="store_true", help=t("cli.help.no_goal"))
    go.add_argument("--judge-can-run", action="store_true", help=t("cli.help.judge_can_run"))
    go.add_argument(
        "--timeout", type=float, default=1800.0, metavar="SECONDS", help=t("cli.help.timeout")
    )
    go.add_argument("--isolate", action="store_true", help=t("cli.help.isolate"))
    go.add_argument("--window", type=int, default=None, metavar="N", help=t("cli.help.window"))
    go.add_argument("--no-handoff", action="store_true", help=t("cli.help.no_handoff"))
    go.add_argument("--new", action="store_true", help=t("cli.help.new"))
    go.add_argument("--clarify-only", action="store_true", help=t("cli.help.clarify_only"))
    go.add_argument("--no-trim", action="store_true", help=t("cli.help.no_trim"))

    run = sub.add_parser("run", help=t("cli.help.run"), description=t("cli.help.run"))
    _globals(run, suppress=True)
    run.add_argument("target", help=t("cli.help.target"))
    run.add_argument("--verify", action="store_true", help=t("cli.help.verify"))

    once = sub.add_parser("once", help=t("cli.help.once"), description=t("cli.help.once"))
    _globals(once, suppress=True)
    once.add_argument("prompt", help=t("cli.help.prompt"))
    once.add_argument("-i", "--instructions", default="", help=t("cli.help.instructions"))
    once.add_argument("-t", "--tools", default=None, help=t("cli.help.tools"))
    once.add_argument(
        "-p",
        "--permission-mode",
        default="default",
        choices=PERMISSION_MODES,
        help=t("cli.help.permission_mode"),
    )
    once.add_argument("-b", "--budget", type=float, default=None, help=t("cli.help.budget"))
    once.add_argument("--resume", default=None, metavar="SESSION_ID", help=t("cli.help.resume"))
    once.add_argument("--fork", action="store_true", help=t("cli.help.fork"))

    setup = sub.add_parser("setup", help=t("cli.help.setup"), description=t("cli.help.setup"))
    _globals(setup, suppress=True)
    return main


def with_default_cmd(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` with its subcommand filled in: ``flower "做 X"`` is ``flower go "做 X"``.

    The global flags are read off ``parser`` (a flag with ``nargs == 0`` stands alone, any
    other takes a value, also as ``--flag=value``). The scan stops at the first token that
    is not a global flag: a subcommand is left as it is, anything else gets ``go`` put in
    front of it; no such token means ``go`` at the end. ``-h``/``--help`` anywhere: as is.
    """
    if "-h" in argv or "--help" in argv:
        return argv
    bare: set[str] = set()
    valued: set[str] = set()
    for action in parser._actions:  # argparse has no public list of its flags
        if isinstance(action, argparse._SubParsersAction):
            continue
        (bare if action.nargs == 0 else valued).update(action.option_strings)
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in bare:
            i += 1
        elif tok in valued:
            if i + 1 >= len(argv):
                return argv  # its value is missing: argparse says so (exit 2)
            i += 2
        elif tok.startswith("--") and tok.partition("=")[0] in valued:
            i += 1
        else:
            if tok in CMDS:
                return argv
            return [*argv[:i], "go", *argv[i:]]
    return [*argv, "go"]


# -- entry --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    from supervisor.commands.leaving import ended

    return ended(_main(argv))


def _main(argv: list[str] | None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(with_default_cmd(args_in, parser))
    if args.cmd is None:
        parser.error(t("cli.no_cmd"))
    try:
        if args.cmd == "setup":
            from supervisor.commands.setup import setup_main

            return setup_main()
        if args.cmd == "once":
            return _once(args)
        if args.cmd == "run":
            return _run(args)
        return _go(args)
    except Stop as stop:
        _err(stop.message, stop.hint)
        return stop.code
    except KeyboardInterrupt:  # before a run started (a run handles its own Ctrl-C)
        _err(t("cli.cancelled"))
        return 1
    except Exception as exc:
        from flower import FlowerError

        if isinstance(exc, FlowerError):
            _err(exc.message, exc.hint)
            return 1
        raise


def _err(message: str, hint: str = "") -> None:
    print(message, file=sys.stderr, flush=True)
    if hint:
        print(t("cli.hint", hint=hint), file=sys.stderr, flush=True)


def _workspace(args: argparse.Namespace) -> Path:
    from supervisor.commands.cli import workspace_dir

    return workspace_dir(Path(args.workspace))  # FlowerError: one line, exit 1


def _run_dir(args: argparse.Namespace) -> Path:
    from supervisor.commands.cli import check_run_dir

    path = Path(args.run_dir).expanduser()
    check_run_dir(path)
    return path.absolute()


def _state(args: argparse.Namespace, workspace: Path, run_dir: Path) -> tuple[Choice, Any]:
    """The run state this command uses (:mod:`supervisor.inspect.runstate`), opened before anything
    is made: one that cannot be used stops here (one line, exit 1) and leaves no trace."""
    from supervisor.run.secrets import warn_if_password_in_argv

    given = getattr(args, "state", None)
    chosen = choose(given, workspace)
    opened = open_chosen(chosen, run_dir=run_dir, workspace=workspace, create=True)
    warn_if_password_in_argv(given)  # once it runs: a mistake stays one line
    return chosen, opened


def _placement(args: argparse.Namespace, workspace: Path, opened: Any) -> str | None:
    """Where the run's attempts go (:func:`supervisor.cluster.remote.choose_placement`): None for
    forked children here; checked before anything runs."""
    from supervisor.cluster.remote import choose_placement

    given = getattr(args, "placement", None)
    return choose_placement(given, workspace, opened, wait_s=START_WAIT_S, waiting=warn)


def _placement_args(args: argparse.Namespace) -> list[str]:
    given = getattr(args, "placement", None)
    return ["--placement", given] if given else []


def _credentials(args: argparse.Namespace, workspace: Path) -> None:
    """Gate one (are there credentials) and gate two (do they work), as setup says."""
    _have_credentials(workspace)
    _credentials_work(args)


def _have_credentials(workspace: Path) -> None:
    """Gate one: credentials are found, or asked for on a terminal (no request is sent)."""
    from supervisor.commands.setup import SetupExit, have_credentials

    try:
        have_credentials(
            interactive=sys.stdin.isatty(), say=_say, read_line=_input_line, workspace=workspace
        )
    except SetupExit as exc:
        raise Stop(exc.message, exc.code) from None


def _credentials_work(args: argparse.Namespace) -> None:
    """Gate two: the probe's one request (a rejected key gets one chance on a terminal)."""
    from supervisor.commands.setup import SetupExit, credentials_work

    try:
        credentials_work(interactive=sys.stdin.isatty(), say=_say, read_line=_input_line)
    except SetupExit as exc:
        raise Stop(exc.message, exc.code) from None
    if args.verbose:
        from supervisor.commands.setup import describe_credentials

        for line in describe_credentials():
            _say(line)


def _say(text: str = "") -> None:
    print(text, flush=True)


def _input_line(prompt: str) -> str | None:
    """One line typed at a prompt (not through a shell: quotes and ！ type as they are);
    None for Ctrl-D."""
    try:
        return input(prompt)
    except EOFError:
        return None


def _first_piped_line() -> str:
    """The first line of a piped stdin, read byte by byte: the lines after it stay in the
    pipe for the run's own reader (answers to questions, more to add)."""
    import os

    raw = bytearray()
    try:
        while True:
            b = os.read(0, 1)
            if not b or b == b"\n":
                break
            raw += b
    except OSError:
        pass
    return raw.decode("utf-8", "replace").strip()


def _read_ask(waking: bool) -> str:
    """The startup prompt. Ctrl-C / Ctrl-D: 已取消 (exit 1)."""
    if not sys.stdin.isatty():
        return _first_piped_line()  # piped: no header, just the line
    _say(t("cli.prompt.wake" if waking else "cli.prompt.first"))
    try:
        line = input("> ")
    except (EOFError, KeyboardInterrupt):
        _say()
        raise Stop(t("cli.cancelled")) from None
    return line.strip()


def _go(args: argparse.Namespace) -> int:
    from flower.workflow.starter import NO_ASK, NOT_GIT, in_git, wake_state
    from supervisor.cluster.remote import cluster_placement
    from supervisor.run.flows import starter
    from supervisor.run.start import StartArgs, run_start
    from supervisor.terminal.terminal import Terminal

    if args.window is not None and args.window < 0:
        raise Stop(t("cli.bad_window", value=args.window), code=2)
    ws = _workspace(args)
    run_dir = _run_dir(args)
    if args.isolate and not in_git(ws):
        raise Stop(t("cli.not_git", ws=ws))
    chosen, opened = _state(args, ws, run_dir)
    with starting(opened):  # the database going away now is waited for
        remote = _placement(args, ws, opened)
        _have_credentials(ws)
        new = bool(args.new)
        ask = args.ask
        timeout_s = max(0.0, float(args.timeout))
        state = wake_state(ws, run_dir=run_dir, isolate=args.isolate, state=opened)
        waking = bool(state["waking"]) and not new
        if ask is None:
            # Unattended (--timeout 0) never waits at a prompt: nothing said is "carry on".
            ask = "" if timeout_s == 0 and sys.stdin.isatty() else _read_ask(waking)
            if ask == "/new":
                new, waking = True, False
                ask = _read_ask(False)
        ask = ask.strip()
        # Refused before any model call (the probe included): nothing to do is no request.
        if new and not ask:
            raise Stop(t("cli.new_needs_ask"))
        if not ask and not waking and not (state["clarifying"] and not new):
            raise Stop(t("cli.empty_first"))
        _credentials_work(args)
        if not sys.stdin.isatty() and timeout_s > 0:
            print(t("cli.piped"), file=sys.stderr, flush=True)
        try:
            wf = starter(
                ask,
                ws,
                run_dir,
                new=new,
                rounds=args.rounds,
                timeout_s=timeout_s,
                goal=not args.no_goal,
                isolate=args.isolate,
                clarify_only=args.clarify_only,
                judge_can_run=args.judge_can_run,
                max_asks=None if args.asks < 0 else args.asks,
                state=opened,
            )
        except Exception as exc:
            from flower import ConfigError

            if isinstance(exc, ConfigError) and exc.message == NO_ASK:
                raise Stop(t("cli.no_ask")) from None
            if isinstance(exc, ConfigError) and exc.message == NOT_GIT.format(ws=ws):
                raise Stop(t("cli.not_git", ws=ws)) from None
            raise
        term = Terminal(verbose=args.verbose)
        start = StartArgs(
            ask=ask,
            workspace=ws,
            run_dir=run_dir,
            new=new,
            trim=not args.no_trim,
            command=_go_command(args, ws, run_dir) + chosen.carry_args() + _placement_args(args),
            archive=False,
            handoff=_handoff(args),
            state=opened,
            placement=cluster_placement(remote, opened, wf, term.ask, trim=not args.no_trim),
        )
    return _after_stop(run_start(wf, start, term), term)


def _after_stop(code: int, term: Any) -> int:
    """A run stopped by what looks like a rejected credential: offer to set them again here
    (a terminal only), then exit 1 either way: the same command carries on."""
    why = str(getattr(term, "stop_reason", "") or "")
    if code != 1 or not why or not sys.stdin.isatty():
        return code
    from supervisor.commands.setup import configure, looks_like_credentials_error

    if not looks_like_credentials_error(why):
        return code
    term.say(t("setup.crash.looks_like_auth", detail=why[:120]))
    if configure(t("setup.reason.again"), read_line=_input_line, say=_say):
        _say(t("setup.crash.configured"))
    return 1


def _handoff(args: argparse.Namespace) -> Any:
    from flower.step.window import HandoffPolicy

    if args.no_handoff:
        return False
    if args.window:
        return HandoffPolicy(window=args.window)
    return True


def _go_command(args: argparse.Namespace, ws: Path, run_dir: Path) -> list[str]:
    """The command that carries this run on (``status`` shows it for a dead run)."""
    cmd = ["flower", "-w", str(ws), "-r", str(run_dir)]
    if args.rounds != 3:
        cmd += ["--rounds", str(args.rounds)]
    if args.timeout != 1800.0:
        cmd += ["--timeout", f"{args.timeout:g}"]
    for flag in ("no_goal", "judge_can_run", "isolate", "no_handoff", "no_trim", "clarify_only"):
        if getattr(args, flag):
            cmd.append("--" + flag.replace("_", "-"))
    if args.asks >= 0:
        cmd += ["--asks", str(args.asks)]
    if args.window:
        cmd += ["--window", str(args.window)]
    return cmd


def _run(args: argparse.Namespace) -> int:
    from supervisor.cluster.remote import cluster_placement
    from supervisor.run.flows import load_flow
    from supervisor.run.start import StartArgs, run_start
    from supervisor.terminal.terminal import Terminal

    ws = _workspace(args)
    run_dir = _run_dir(args)
    from flower import FlowerError
    from flower.workflow.verify import FlowInvalid

    try:
        wf = load_flow(args.target)
    except FlowInvalid as exc:
        raise Stop(exc.message, code=2, hint=exc.hint) from None
    except FlowerError as exc:  # a target that does not load: a stop, or for --verify a 2
        raise Stop(exc.message, code=2 if args.verify else 1, hint=exc.hint) from None
    if args.verify:
        _say(t("cli.verified", flow=wf.name, n=len(wf.steps)))
        return 0
    chosen, opened = _state(args, ws, run_dir)
    with starting(opened):  # the database going away now is waited for
        remote = _placement(args, ws, opened)
        _credentials(args, ws)
        workbench: Any = wf.workbench
        if workbench is None:
            workbench = bool(args.workbench)
        term = Terminal(verbose=args.verbose)
        start = StartArgs(
            ask="",
            workspace=ws,
            run_dir=run_dir,
            new=False,
            trim=bool(args.trim),
            command=[
                "flower",
                "-w",
                str(ws),
                "-r",
                str(run_dir),
                *(["-W"] if args.workbench else []),
                *(["-T"] if args.trim else []),
                *chosen.carry_args(),
                *_placement_args(args),
                "run",
                args.target,
            ],
            archive=False,
            workbench=workbench,
            state=opened,
            placement=cluster_placement(remote, opened, wf, term.ask, trim=bool(args.trim)),
        )
    return _after_stop(run_start(wf, start, term), term)


def _once(args: argparse.Namespace) -> int:
    import asyncio
    import time

    from flower import AgentSpec, Runtime
    from supervisor.terminal.terminal import Terminal, clock, unreachable

    ws = _workspace(args)
    run_dir = _run_dir(args)
    if getattr(args, "placement", None):
        raise Stop(t("cli.once_placement"), code=2, hint=t("cli.once_placement.hint"))
    _, opened = _state(args, ws, run_dir)
    _credentials(args, ws)
    tools = [x.strip() for x in (args.tools or ONCE_TOOLS).split(",") if x.strip()]
    spec = AgentSpec(
        name="ad-hoc",
        instructions=args.instructions,
        allowed_tools=tools,
        permission_mode=args.permission_mode,
        max_budget_usd=args.budget,
    )
    term = Terminal(verbose=args.verbose)
    rt = Runtime(
        workspace=ws,
        run_dir=run_dir,
        trim=bool(args.trim),
        workbench=bool(args.workbench),
        state=opened,
    )
    began = time.monotonic()

    async def once() -> Any:
        # Its one step needs the model: an unreachable endpoint is said at once and waited
        # for here (the CLI would retry in silence for minutes).
        gave_up = unreachable(rt.resilience, term.say)
        if gave_up and not await rt.resilience.wait_online():
            raise Stop(gave_up, hint=t("setup.offline.hint"))
        return await rt.run(
            spec, args.prompt, resume=args.resume, fork=args.fork, on_event=term.on_event
        )

    from supervisor.run.start import stacks_on_usr1

    stacks_on_usr1()
    try:
        result = asyncio.run(once())
    except KeyboardInterrupt:  # once has no interrupt-and-say: Ctrl-C ends it
        term.err(t("cli.cancelled"))
        return 130
    finally:
        rt.close()
    if not result.ok:
        term.err(t("cli.once.failed", error=result.error or "?"))
    term.say(
        t(
            "cli.once.done",
            mark="+" if result.ok else "x",
            elapsed=clock(time.monotonic() - began),
            cost=result.cost_usd,
            session=result.session_id or "-",
        )
    )
    term.closing(rt)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
