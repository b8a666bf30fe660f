"""``flower-super``: start a flow under a supervisor, look at a run_dir, try it offline.

Every mistake a person can make ends in one line and a hint (exit status 2), never a
traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from flower import FlowerError, __version__
from flower.i18n import define, t

define(
    {
        "cli.hint": ("  提示:{hint}", "  hint: {hint}"),
        "cli.run_dir_file": ("运行目录 {path} 是个文件", "run directory {path} is a file"),
        "cli.run_dir_under_file": (
            "运行目录 {path} 在文件 {level} 底下",
            "run directory {path} lies under {level}, which is a file",
        ),
        "cli.run_dir.hint": (
            "-r 给一个目录(没有会建),例如 -r runs",
            "pass -r with a directory (it is created if missing), e.g. -r runs",
        ),
        "cli.not_dir": ("工作区 {ws} 不是目录", "workspace {ws} is not a directory"),
        "cli.verified": ("流程 '{flow}' 没问题:{n} 个步骤", "flow '{flow}' is valid: {n} steps"),
        "cli.not_dir.hint": ("先建好它,或者用 -w 指定目录", "create it first or pass -w DIR"),
    }
)

RUN_DIR_HELP = (
    "run directory holding lineage.json, manifest.json, sessions.db"
    " (default ./runs, relative to the current directory)"
)


run_dir_option = click.option(
    "-r",
    "--run-dir",
    type=click.Path(path_type=Path),
    default=Path("runs"),
    show_default=True,
    help=RUN_DIR_HELP,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__, "--version", prog_name="flower-super", message="%(prog)s %(version)s"
)
def main() -> None:
    """flower-super: run flower workflows with one supervised child process per step.

    Run it again in the same directory and it carries on the same conversation, whether the
    last run finished, was Ctrl-C'd, got SIGTERM/SIGHUP, was kill -9'd or the machine
    rebooted.
    """


@main.command()
@click.argument("ask", required=False, default="")
@click.option(
    "--flow",
    "flow_ref",
    metavar="FILE.py:ATTR|MODULE:ATTR",
    help=(
        "your own Workflow to run (default: the starter flow 确认需求 → 设定目标 → 干活);"
        ' ASK reaches it as ctx["_ask"], or as the argument of a callable ATTR'
    ),
)
@run_dir_option
@click.option(
    "-w",
    "--workspace",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="the directory the agents work in (default: the current directory)",
)
@click.option(
    "--new",
    is_flag=True,
    help="do not continue last time: archive lineage.json, 需求.md, 目标.md and start a new thing",
)
@click.option(
    "--no-trim",
    is_flag=True,
    help="do not trim large old tool results when resuming (trimming is on by default here)",
)
@click.option(
    "--rounds",
    type=int,
    default=3,
    show_default=True,
    metavar="N",
    help="starter flow: work rounds in all (each judged in a fresh session); 0 and 1 mean one",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=1800.0,
    show_default=True,
    metavar="SECONDS",
    help="starter flow: how long a question waits for you; 0 (or less) = unattended, "
    "every question falls through at once and the agent decides",
)
@click.option(
    "--no-goal",
    is_flag=True,
    help="starter flow: no 目标.md and no judge; the run is done when the work step is",
)
def start(
    ask: str,
    flow_ref: str | None,
    run_dir: Path,
    workspace: Path | None,
    new: bool,
    no_trim: bool,
    rounds: int,
    timeout_s: float,
    no_goal: bool,
) -> None:
    """Start (or carry on) a flow. ASK is what you want done; nothing = carry on.

    Without --flow it runs the starter flow: 确认需求 (asks until the requirement is clear,
    frozen as .flower/notes/需求.md), 设定目标 (a goal with a checklist, .flower/notes/目标.md),
    干活 (a coordinator with a coder), judged after every round by a judge in a new session.
    Run again with a sentence and it is added to 需求.md, the goal is derived again and the
    work carries on in the same session; run again with nothing and it simply carries on.

    \b
    Examples:
      flower-super start "write a markdown to html script"
      flower-super start "also highlight code blocks"   # same conversation, one more sentence
      flower-super start                                 # carry on where it stopped
      flower-super start --flow flows/review.py:flow -r runs

    \b
    While it runs:
      Ctrl-C once   interrupt the step; type a sentence (or just Enter) and it carries on
      Ctrl-C twice  exit; run the same command again later to continue
      SIGTERM/HUP   the step in flight is recorded as killed-by-signal; a restart resumes
      failures      an API error or a step child that died is one failed attempt: the same
                    session is resumed after a backoff, up to 6 attempts in all; a bug or a
                    bad spec stops the step at once (traceback in runs/logs/<run>/<step>.log)

    Exit status: 0 finished; 1 a step stopped the run (the line "在步骤 '<step>' 中止:<why>");
    2 a mistake (one line with a hint); 130 after Ctrl-C twice.
    """
    from .flows import load_flow, starter
    from .start import StartArgs, run_start
    from .terminal import Terminal

    ws = (workspace or Path.cwd()).expanduser()
    try:
        if not ws.is_dir():
            raise FlowerError(t("cli.not_dir", ws=ws), hint=t("cli.not_dir.hint"))
        check_run_dir(run_dir)
        if flow_ref:
            wf = load_flow(flow_ref, ask)
        else:
            wf = starter(
                ask, ws, run_dir, new=new, rounds=rounds, timeout_s=timeout_s, goal=not no_goal
            )
        args = StartArgs(
            ask=ask,
            workspace=ws.resolve(),
            run_dir=run_dir.expanduser().absolute(),
            new=new,
            trim=not no_trim,
            command=_resume_command(
                flow_ref, run_dir, workspace, _starter_options(rounds, timeout_s, no_goal)
            ),
            archive=bool(flow_ref),
        )
        code = run_start(wf, args, Terminal())
    except FlowerError as exc:
        _fail(exc)
    sys.exit(code)


def _starter_options(rounds: int, timeout_s: float, no_goal: bool) -> list[str]:
    """The starter flow's options as given (only those not at their default)."""
    out = [] if rounds == 3 else ["--rounds", str(rounds)]
    out += [] if timeout_s == 1800.0 else ["--timeout", f"{timeout_s:g}"]
    return out + (["--no-goal"] if no_goal else [])


def _resume_command(
    flow_ref: str | None, run_dir: Path, workspace: Path | None, options: list[str] | None = None
) -> list[str]:
    """The command that carries this run on later (shown by status for a dead run)."""
    cmd = ["flower-super", "start"]
    if flow_ref:
        cmd += ["--flow", flow_ref]
    else:
        cmd += options or []
    cmd += ["-r", str(run_dir.expanduser().absolute())]
    cmd += ["-w", str((workspace or Path.cwd()).expanduser().resolve())]
    return cmd


@main.command()
@run_dir_option
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of text")
def status(run_dir: Path, as_json: bool) -> None:
    """Every flower that ran in RUN_DIR: live or dead, state, step, session, last rows.

    Exit status 0 when nothing is dead-and-unfinished, 3 otherwise.
    """
    from .status import collect, render_text

    try:
        report = collect(run_dir)
    except FlowerError as exc:
        _fail(exc, as_json=as_json)
    if as_json:
        import json

        click.echo(json.dumps(report.to_json(), ensure_ascii=False, indent=2))
    else:
        click.echo(render_text(report))
    sys.exit(3 if report.dead_unfinished else 0)


@main.command()
@click.argument("run")
@run_dir_option
def cancel(run: str, run_dir: Path) -> None:
    """Stop the live flower RUN (a run id from `status`, or a unique prefix) as SIGTERM does.

    Its step in flight gets one killed-by-signal row and its children stop; the run stays
    resumable: `flower-super start` in the same place carries on. A run that is not live,
    or unknown, is one line and exit status 2.
    """
    from .cancel import cancel as cancel_run

    try:
        done = cancel_run(run_dir.expanduser().absolute(), run)
    except FlowerError as exc:
        _fail(exc)
    rec = done.record
    if not done.stopped:
        click.echo(t("cancel.still_there", pid=rec.pid, run=rec.run))
        sys.exit(1)
    resume = " ".join(rec.command) if rec.command else "flower-super start"
    click.echo(t("cancel.stopped", run=rec.run, pid=rec.pid, resume=resume))


@main.command()
@click.option(
    "--flow",
    "flow_ref",
    required=True,
    metavar="FILE.py:ATTR|MODULE:ATTR",
    help="the Workflow to check",
)
def verify(flow_ref: str) -> None:
    """Check a flow without running it: exit 0 when it is valid, else exit 2 with one line per
    problem naming the step and the rule (cross-run on a judged, human-facing or
    idempotent=False step; an unknown fingerprint prefix; a bad ttl). `start --flow` refuses
    an invalid flow the same way before any model call."""
    from .flows import load_flow

    try:
        wf = load_flow(flow_ref)
    except FlowerError as exc:
        _fail(exc)
    click.echo(t("cli.verified", flow=wf.name, n=len(wf.steps)))


@main.command()
@click.argument("what", metavar="[RUN | STEP]", required=False)
@run_dir_option
@click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of text")
def show(what: str | None, run_dir: Path, as_json: bool) -> None:
    """Print a step's conversation from sessions.db: prompts, the model's text, each tool
    call on one line, each result folded.

    \b
    Nothing: the latest step of the latest run (the one in flight, if it is live).
    RUN: every conversation of that run, in the order it ran them (a run id from
         `status`, or a unique prefix).
    STEP: that step's session (a name, or a label as the manifest writes it: 干活#round2).

    It reads sessions.db read-only, so it is safe while a flower runs. An unknown run or
    step is one line and exit status 2.
    """
    from .show import run

    try:
        run(what, run_dir, as_json)
    except FlowerError as exc:
        _fail(exc, as_json=as_json)


@main.command()
@click.argument("run", required=False)
@click.option("-f", "--follow", "follow_", is_flag=True, help="keep printing while it runs")
@run_dir_option
def logs(run: str | None, follow_: bool, run_dir: Path) -> None:
    """Print a run's events, one line each: time, step, kind, text (default: the latest run).

    RUN is a run id from `status`, or a unique prefix. With -f it keeps printing the
    events of a live flower as they come and ends when that flower ends (Ctrl-C ends it
    too, exit status 130). A run from before event logs existed has none: one line, exit
    status 1. An unknown run is one line and exit status 2.
    """
    from .logs import run as run_logs

    try:
        run_logs(run, follow_, run_dir)
    except FlowerError as exc:
        _fail(exc)


@main.command(
    "model-server",
    # flower.testing.SCRIPT_FORMAT, every paragraph marked \b so Click prints it as written
    # (its module has no imports: --help stays cheap).
    epilog="\n\n".join(
        "\b\n" + paragraph
        for paragraph in __import__(
            "flower.testing._format", fromlist=["SCRIPT_FORMAT"]
        ).SCRIPT_FORMAT.split("\n\n")
    ),
)
@click.option(
    "--script",
    "script_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="JSON script of turns (the format is below)",
)
@click.option(
    "--port", type=int, default=0, show_default=True, help="port on 127.0.0.1 (0 = any free port)"
)
@click.option(
    "--log",
    "log_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="append every request as a JSON line here",
)
def model_server(script_path: str, port: int, log_path: str | None) -> None:
    """Serve the Anthropic Messages API on loopback from a script (for tests and demos).

    Prints its URL once listening and serves until SIGTERM or Ctrl-C. Point the CLI at it
    with ANTHROPIC_BASE_URL=<url>, any ANTHROPIC_API_KEY, a fresh HOME and CLAUDE_CONFIG_DIR
    and CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 (flower.testing.cli_env builds it all).
    """
    from flower.testing.model_server import main as serve

    argv = ["--script", script_path, "--port", str(port)]
    if log_path:
        argv += ["--log", log_path]
    sys.exit(serve(argv))


@main.command()
@click.option("--keep", is_flag=True, help="keep the temporary workspace and print where it is")
def demo(keep: bool) -> None:
    """No key, no network: run a flow against a scripted model, kill -9 it mid-step, resume."""
    from .demo import run_demo

    try:
        sys.exit(run_demo(keep=keep))
    except FlowerError as exc:
        _fail(exc)


def check_run_dir(run_dir: Path) -> None:
    """A run directory that cannot exist (it is a file, or lies under one) is a mistake."""
    path = run_dir.expanduser().absolute()
    for level in (path, *path.parents):
        if level.is_dir():
            return
        if level.exists():
            if level == path:
                message = t("cli.run_dir_file", path=path)
            else:
                message = t("cli.run_dir_under_file", path=path, level=level)
            raise FlowerError(message, hint=t("cli.run_dir.hint"))


def _fail(exc: FlowerError, *, as_json: bool = False) -> None:
    if as_json:  # a script reading --json gets JSON, errors included
        import json

        click.echo(json.dumps({"error": exc.message, "hint": exc.hint}, ensure_ascii=False))
        sys.exit(2)
    click.echo(f"flower-super: {exc.message}", err=True)
    if exc.hint:
        click.echo(t("cli.hint", hint=exc.hint), err=True)
    sys.exit(2)
