"""Resolving the Workflow a start runs: a user flow by reference, or the starter flow.

``--flow path/to/file.py:attr`` or ``--flow package.module:attr``; ``attr`` names a
``Workflow`` or a callable returning one (called with the ask when it takes an argument).
Every way this can go wrong is one line with a hint, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import flower
from flower import ConfigError, RunDirBusy
from flower.i18n import define, t
from flower.people.credentials import check_credentials, load_dotenv
from flower.state.backends import RunState, open_state
from flower.workflow import Workflow
from flower.workflow.starter import starter_flow
from flower.workflow.verify import check

define(
    {
        "flow.colon": (
            "需要 模块:属性 形式,例如 flows:main",
            "{ref!r} is not FILE.py:ATTR or MODULE:ATTR",
        ),
        "flow.colon.hint": (
            "例如 flows/review.py:flow 或 mypkg.flows:review",
            "for example flows/review.py:flow or mypkg.flows:review",
        ),
        "flow.missing": (
            "找不到 {path}(当前目录 {cwd})。给的是文件路径就要能对上;要按模块名导入就别带 .py",
            "flow file not found: {path} (current directory {cwd})",
        ),
        "flow.missing.hint": (
            "路径相对当前目录",
            "give a path relative to the current directory, or MODULE:ATTR without .py",
        ),
        "flow.attr": ("'{module}' 里没有 '{attr}'", "{module} has no attribute {attr!r}"),
        "flow.attr.hint": ("那里定义的 Workflow:{names}", "Workflows defined there: {names}"),
        "flow.no_module": (
            "导入 '{module}' 失败:No module named {name!r}",
            "no module named {name!r}",
        ),
        "flow.no_module.hint": (
            "在放它的目录里运行,或者给 文件.py:属性",
            "run from the directory that holds it, or give FILE.py:ATTR",
        ),
        "flow.import": ("导入 '{module}' 失败:{error}", "importing {module} failed: {error}"),
        "flow.syntax": ("导入 '{module}' 失败:{error}", "{module} is not valid Python: {error}"),
        "flow.not_py": ("导入 '{module}' 失败:不是 Python 文件", "cannot import {module}"),
        "flow.returned": (
            "'{ref}' 返回的是 {kind},不是 Workflow",
            "{ref} returned a value of type {kind}, not a Workflow",
        ),
        "flow.returned.hint": ("返回 flower.Workflow([...])", "return flower.Workflow([...])"),
        "flow.not_flow": (
            "'{ref}' 是 {kind},不是 Workflow",
            "{ref} is of type {kind}, not a Workflow",
        ),
        "flow.not_flow.hint": ("指向一个 flower.Workflow", "point it at a flower.Workflow"),
        "flow.check_module": ("看看这个流程模块", "check the flow module"),
        "flow.ask.hint": (
            '例如:flower "写个 md 转 html 的脚本"',
            'for example: flower "write a script that turns markdown into html"',
        ),
        "flow.new_needs_ask": (
            "--new 是重开一件事,要说是什么事",
            "--new starts a new thing and needs a sentence saying what",
        ),
        "flow.new_needs_ask.hint": ('flower --new "另一件事"', 'flower --new "something else"'),
        "flow.new_busy": (
            "{label} {where} 正被 flower pid {pid}(在 {host} 上)用着;--new 会把它的血缘归档",
            "the {label} {where} is in use by flower pid {pid} (on {host}); --new would archive "
            "its lineage",
        ),
        "flow.new_busy.hint": (
            "等它跑完或先停下它,或者换一个运行目录(-r)",
            "wait for it to finish or stop it, or use another --run-dir (-r)",
        ),
    }
)


def starter(
    ask: str,
    workspace: Path,
    run_dir: Path,
    *,
    new: bool,
    rounds: int,
    timeout_s: float,
    goal: bool = True,
    isolate: bool = False,
    clarify_only: bool = False,
    judge_can_run: bool = False,
    max_asks: int | None = None,
    state: RunState | None = None,
) -> Workflow:
    """The starter flow a bare ``flower-super start`` runs; its refusals are one line.

    ``--new`` moves files, so everything that could still refuse the start is checked
    first: a sentence to start over with, credentials, no live flower in the run_dir (or,
    with shared ``state``, in the workspace). ``state`` is the run state the start uses
    (:func:`flower.state.backends.open_state`; None: the run_dir's files)."""
    if new:
        _check_before_archiving(ask, workspace, run_dir, state)
    try:
        wf = starter_flow(
            ask,
            workspace=workspace,
            run_dir=run_dir,
            new=new,
            rounds=rounds,
            goal=goal,
            timeout_s=max(0.0, timeout_s),
            isolate=isolate,
            clarify_only=clarify_only,
            judge_can_run=judge_can_run,
            max_asks=max_asks,
            state=state,
        )
    except ValueError as exc:
        raise ConfigError(str(exc), hint=t("flow.ask.hint")) from None
    options = {
        "rounds": rounds,
        "goal": goal,
        "timeout_s": max(0.0, timeout_s),
        "isolate": isolate,
        "clarify_only": clarify_only,
        "judge_can_run": judge_can_run,
        "max_asks": max_asks,
    }
    setattr(wf, RECIPE, {"kind": "starter", "ask": ask, "options": options})
    return wf


def _check_before_archiving(
    ask: str, workspace: Path, run_dir: Path, state: RunState | None
) -> None:
    if not ask.strip():
        raise ConfigError(t("flow.new_needs_ask"), hint=t("flow.new_needs_ask.hint"))
    load_dotenv(workspace, Path.cwd())
    check_credentials()
    refuse_new_while_live(state or open_state("", run_dir=run_dir, workspace=workspace))


def refuse_new_while_live(state: RunState) -> None:
    """``--new`` moves the lineage away: not while a live flower uses it (the run_dir's, or
    with shared state the workspace's)."""
    live = state.registry.live()
    if not live:
        return
    message = t(
        "flow.new_busy",
        where=state.scope.path,
        label=state.scope.noun,
        pid=live[0].pid,
        host=live[0].host or "?",
    )
    raise RunDirBusy(message, hint=t("flow.new_busy.hint"))


define(
    {
        "flow.same_words": (
            "-- 上次的运行 {run} 没做完:接着用它的原话 {ask}",
            "-- run {run} stopped unfinished: carrying it on with its words {ask}",
        ),
        "flow.words_changed": (
            "! 原话变了(没做完的运行 {run} 用的是 {was}):各步骤从头做",
            "! the words changed (the unfinished run {run} had {was}): its steps start over",
        ),
    }
)


def carried_words(
    state: RunState, flow: str, workspace: Path, ask: str, *, new: bool
) -> tuple[str, str | None]:
    """The words a start of ``flow`` in ``workspace`` runs with, and the one line that says
    so (None: nothing to say). Without words, the last run of the flow here stopped
    unfinished and its words carry on with it; other words than that run's start it over
    (its steps' inputs changed), which is said. ``--new`` carries nothing on."""
    from flower.state.registry import FINISHED
    from flower.workflow.resume import last_run

    if new:
        return ask, None
    last = last_run(state.registry, flow, workspace, state.workspace_id)
    if last is None or last.state == FINISHED or last.ask is None or last.alive:
        return ask, None
    if not ask and last.ask:
        return last.ask, t("flow.same_words", run=last.run, ask=_quoted(last.ask))
    if ask and ask != last.ask:
        return ask, t("flow.words_changed", run=last.run, was=_quoted(last.ask))
    return ask, None


def _quoted(words: str) -> str:
    """Words on one line, quoted (a JSON string: newlines and quotes escaped)."""
    import json

    return json.dumps(words, ensure_ascii=False)


def load_flow(ref: str, ask: str = "") -> Workflow:
    """Import ``ref`` (``file.py:attr`` or ``module:attr``) and return its Workflow."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ConfigError(t("flow.colon", ref=ref), hint=t("flow.colon.hint"))
    module = (
        _import_file(target) if target.endswith(".py") or "/" in target else _import_module(target)
    )
    if not hasattr(module, attr):
        names = ", ".join(n for n, v in vars(module).items() if isinstance(v, Workflow)) or "none"
        raise ConfigError(
            t("flow.attr", module=target, attr=attr), hint=t("flow.attr.hint", names=names)
        )
    wf = _as_workflow(getattr(module, attr), ref, ask)
    check(wf)  # an invalid flow is refused before any model call (FlowInvalid: exit 2)
    if target.endswith(".py") or "/" in target:  # a file: where it is, from anywhere
        ref = f"{os.path.abspath(target)}:{attr}"
    setattr(wf, RECIPE, {"kind": "target", "ref": ref, "ask": ask})
    return wf


#: How a Workflow was built (the attribute :func:`load_flow` and :func:`starter` set), so a
#: worker on another machine builds the same one (supervisor.cluster.worker); :func:`recipe_of`.
RECIPE = "_flower_recipe"


def recipe_of(wf: Workflow) -> dict[str, Any] | None:
    value = getattr(wf, RECIPE, None)
    return dict(value) if isinstance(value, dict) else None


def _import_file(path_text: str) -> Any:
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ConfigError(t("flow.missing", path=path, cwd=Path.cwd()), hint=t("flow.missing.hint"))
    name = f"flower_user_flow_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(t("flow.not_py", module=path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.resolve().parent))
    loader = spec.loader
    _run_user_code(lambda: loader.exec_module(module), str(path))
    return module


def _import_module(name: str) -> Any:
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return _run_user_code(lambda: importlib.import_module(name), name)


def _run_user_code(fn: Any, where: str) -> Any:
    try:
        return fn()
    except ModuleNotFoundError as exc:
        if exc.name and where.startswith(exc.name):
            raise ConfigError(
                t("flow.no_module", module=where, name=exc.name), hint=t("flow.no_module.hint")
            ) from None
        raise ConfigError(
            t("flow.import", module=where, error=exc), hint=_where_in_user_code(exc)
        ) from None
    except ConfigError:
        raise
    except SyntaxError as exc:  # the location is the error's own, not a frame's
        raise ConfigError(
            t("flow.syntax", module=where, error=exc.msg),
            hint=f"at {exc.filename}:{exc.lineno}" + (f":{exc.offset}" if exc.offset else ""),
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised: one line, with its location
        raise ConfigError(
            t("flow.import", module=where, error=f"{type(exc).__name__}: {exc}"),
            hint=_where_in_user_code(exc),
        ) from None


# flower's own source and the import machinery: a frame there is never the user's mistake.
_OURS = tuple(Path(m.__file__ or "").resolve().parent for m in (flower, sys.modules[__name__]))


def _ours(filename: str) -> bool:
    if "importlib" in filename:
        return True
    path = Path(filename).resolve()
    return any(path.is_relative_to(root) for root in _OURS)


def _where_in_user_code(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not _ours(f.filename)]
    if not user:
        return t("flow.check_module")
    f = user[-1]
    return f"at {f.filename}:{f.lineno}"


def _as_workflow(obj: Any, ref: str, ask: str) -> Workflow:
    if isinstance(obj, Workflow):
        return obj
    if callable(obj):
        params = inspect.signature(obj).parameters
        made = _run_user_code(lambda: obj(ask) if params else obj(), ref)
        if isinstance(made, Workflow):
            return made
        raise ConfigError(
            t("flow.returned", ref=ref, kind=type(made).__name__), hint=t("flow.returned.hint")
        )
    raise ConfigError(
        t("flow.not_flow", ref=ref, kind=type(obj).__name__), hint=t("flow.not_flow.hint")
    )
