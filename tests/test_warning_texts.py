"""The ``flower`` logger's warnings are texts for a person (the supervisor's terminal prints
each as a ``! …`` line), so they come from the catalogue like every other text."""

from __future__ import annotations

import ast
import importlib
import re
import string
from pathlib import Path

import pytest

from flower.i18n import keys, t, texts

REPO = Path(__file__).resolve().parents[1]
CJK = re.compile(r"[\u4e00-\u9fff]")
MODULES = (
    "flower.state.stores",
    "flower.state.ledger",
    "flower.state.prune",
    "flower.state.trim",
    "flower.workflow.base",
    "flower.agents.workbench",
    "flower.step.runtime",
    "flower.step.loop",
    "flower.agents.guard",
    "flower.state.lineage",
    "flower.state.registry",
    "flower.state.manifest",
    "flower.people.human",
    "supervisor.run.placement",
)
PREFIXES = {name.rpartition(".")[2] for name in MODULES} - {"base"} | {"workflow"}


def _sources() -> list[Path]:
    paths = [*(REPO / "flower").rglob("*.py"), *(REPO / "stepproc").rglob("*.py")]
    return [*paths, REPO / "supervisor" / "run" / "placement.py"]


def _fields(text: str) -> set[str]:
    # ``{n|row|rows}`` (flower.i18n's plural) names the field ``n``
    return {name.split("|", 1)[0] for _, name, _, _ in string.Formatter().parse(text) if name}


def test_every_warning_is_a_catalogue_text() -> None:
    """``log.warning("%s", t(key, ...))``: no literal text of its own."""
    bad = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("warning", "error", "critical", "exception")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("log", "logger")
            ):
                continue
            args = node.args
            ok = (
                len(args) == 2
                and isinstance(args[0], ast.Constant)
                and args[0].value == "%s"
                and isinstance(args[1], ast.Call)
                and isinstance(args[1].func, ast.Name)
                and args[1].func.id == "t"
            )
            if not ok:
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not bad, bad


def test_the_warning_texts_have_both_languages_and_the_same_fields() -> None:
    for name in MODULES:
        importlib.import_module(name)
    mine = [k for k in keys() if k.split(".")[0] in PREFIXES]
    assert len(mine) >= 30
    for key in mine:
        zh, en = texts(key)
        assert zh and en and not CJK.search(en) and CJK.search(zh), key
        assert _fields(zh) == _fields(en), key


def test_a_warning_speaks_the_persons_language(monkeypatch: pytest.MonkeyPatch) -> None:
    importlib.import_module("flower.state.registry")
    fields = {"path": "/r/flowers/x.json", "aside": "/r/flowers/x.json.corrupt-1"}
    monkeypatch.setenv("FLOWER_LANG", "en")
    assert t("registry.set_aside", **fields) == (
        "/r/flowers/x.json is not a flower record; kept it as /r/flowers/x.json.corrupt-1"
    )
    monkeypatch.setenv("FLOWER_LANG", "zh")
    assert t("registry.set_aside", **fields) == (
        "/r/flowers/x.json 不是 flower 的记录;已留作 /r/flowers/x.json.corrupt-1"
    )
