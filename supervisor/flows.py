"""Resolving the Workflow a start runs: a user flow by reference, or the starter flow.

``--flow path/to/file.py:attr`` or ``--flow package.module:attr``; ``attr`` names a
``Workflow`` or a callable returning one (called with the ask when it takes an argument).
Every way this can go wrong is one line with a hint, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from typing import Any

import flower
from flower import ConfigError, RunDirBusy
from flower.core.credentials import check_credentials, load_dotenv
from flower.core.registry import Registry
from flower.workflow import Workflow
from flower.workflow.starter import starter_flow


def starter(
    ask: str,
    workspace: Path,
    run_dir: Path,
    *,
    new: bool,
    rounds: int,
    timeout_s: float,
    goal: bool = True,
) -> Workflow:
    """The starter flow a bare ``flower-super start`` runs; its refusals are one line.

    ``--new`` moves files, so everything that could still refuse the start is checked
    first: a sentence to start over with, credentials, no live flower in the run_dir."""
    if new:
        _check_before_archiving(ask, workspace, run_dir)
    try:
        return starter_flow(
            ask,
            workspace=workspace,
            run_dir=run_dir,
            new=new,
            rounds=rounds,
            goal=goal,
            timeout_s=max(0.0, timeout_s),
        )
    except ValueError as exc:
        raise ConfigError(
            str(exc), hint='for example: flower-super start "写个 md 转 html 的脚本"'
        ) from None


def _check_before_archiving(ask: str, workspace: Path, run_dir: Path) -> None:
    if not ask.strip():
        raise ConfigError(
            "--new starts a new thing and needs a sentence saying what",
            hint='flower-super start --new "另一件事"',
        )
    load_dotenv(workspace, Path.cwd())
    check_credentials()
    refuse_new_while_live(run_dir)


def refuse_new_while_live(run_dir: Path) -> None:
    """``--new`` moves lineage.json: not while a live flower uses this run_dir."""
    if run_dir.is_dir():
        live = Registry(run_dir).live()
        if live:
            raise RunDirBusy(
                f"run_dir {run_dir} is in use by flower pid {live[0].pid}; --new would move "
                "its lineage.json away",
                hint="wait for it to finish or stop it, or use another --run-dir (-r)",
            )


def load_flow(ref: str, ask: str = "") -> Workflow:
    """Import ``ref`` (``file.py:attr`` or ``module:attr``) and return its Workflow."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise ConfigError(
            f"--flow {ref!r} is not FILE.py:ATTR or MODULE:ATTR",
            hint="for example --flow flows/review.py:flow or --flow mypkg.flows:review",
        )
    module = (
        _import_file(target) if target.endswith(".py") or "/" in target else _import_module(target)
    )
    if not hasattr(module, attr):
        names = ", ".join(n for n, v in vars(module).items() if isinstance(v, Workflow)) or "none"
        raise ConfigError(
            f"{target} has no attribute {attr!r}", hint=f"Workflows defined there: {names}"
        )
    return _as_workflow(getattr(module, attr), ref, ask)


def _import_file(path_text: str) -> Any:
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"flow file not found: {path}", hint="give a path relative to the current directory"
        )
    name = f"flower_user_flow_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {path}", hint="is it a Python file?")
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
                f"no module named {exc.name!r}",
                hint="run from the directory that holds it, or give FILE.py:ATTR",
            ) from None
        raise ConfigError(
            f"importing {where} failed: {exc}", hint=_where_in_user_code(exc)
        ) from None
    except ConfigError:
        raise
    except SyntaxError as exc:  # the location is the error's own, not a frame's
        raise ConfigError(
            f"{where} is not valid Python: {exc.msg}",
            hint=f"at {exc.filename}:{exc.lineno}" + (f":{exc.offset}" if exc.offset else ""),
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised: one line, with its location
        raise ConfigError(
            f"importing {where} failed: {type(exc).__name__}: {exc}", hint=_where_in_user_code(exc)
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
        return "check the flow module"
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
            f"{ref} returned {type(made).__name__}, not a Workflow",
            hint="return flower.Workflow([...])",
        )
    raise ConfigError(
        f"{ref} is a {type(obj).__name__}, not a Workflow", hint="point --flow at a flower.Workflow"
    )
