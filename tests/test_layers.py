"""The architecture's arrows, checked on the source: which of our modules import which.

Every import counts — at module level, inside a function, under ``TYPE_CHECKING`` — because
a cycle that only shows up for the type checker or in one code path is still a cycle for
the next person reading the code. ``from pkg import name`` counts as an import of
``pkg.name`` when that is a module of ours, else of ``pkg`` itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("flower", "supervisor", "stepproc", "ipc")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


DYNAMIC = ("import_module", "__import__")


def _dynamic(node: ast.AST) -> ast.Call | None:
    """``importlib.import_module(…)`` or ``__import__(…)``: an import the statements miss."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return node if called in DYNAMIC else None


def _imports(name: str, path: Path) -> Iterator[str]:
    """Our modules that ``name`` imports, anywhere in its source (a dynamic import of a
    constant name too: ``importlib.import_module("flower")`` is an arrow like any other)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        call = _dynamic(node)
        if call is not None and call.args and isinstance(call.args[0], ast.Constant):
            target = str(call.args[0].value)
            if target.startswith("."):
                anchor = package.split(".")
                dots = len(target) - len(target.lstrip("."))
                target = ".".join([*anchor[: len(anchor) - dots + 1], target.lstrip(".")])
            yield from _ours(target.rstrip("."))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield from _ours(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield from _ours(full if full in MODULES else base)


def _ours(name: str) -> Iterator[str]:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    if name:
        yield name


GRAPH = {name: sorted(set(_imports(name, path)) - {name}) for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return found


def _edges(source: str, target: str) -> list[str]:
    """``a -> b`` for every import from a module under ``source`` of one under ``target``."""
    return [
        f"{a} -> {b}"
        for a, deps in GRAPH.items()
        if a == source or a.startswith(source + ".")
        for b in deps
        if b == target or b.startswith(target + ".")
    ]


def test_the_graph_sees_the_modules_and_their_imports() -> None:
    # The checks below mean nothing if the parser found nothing: a few known arrows.
    assert {"flower.step.loop", "supervisor.run.placement", "stepproc.child", "ipc.codec"} <= set(
        GRAPH
    )
    assert "flower.step.attempt" in GRAPH["flower.step.inprocess"]
    assert "stepproc" in GRAPH["supervisor.run.placement"]
    assert "flower.agents.agent" in GRAPH["flower.step.call"]  # a TYPE_CHECKING import counts


def test_no_import_cycles_between_our_modules() -> None:
    assert _cycles() == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    GRAPH["ipc.codec"].append("ipc.stream")  # stream imports codec already
    try:
        assert ["ipc.codec", "ipc.stream"] in _cycles()
    finally:
        GRAPH["ipc.codec"].remove("ipc.stream")


@pytest.mark.parametrize("other", ["flower", "supervisor", "stepproc"])
def test_ipc_depends_on_nothing_of_ours(other: str) -> None:
    assert _edges("ipc", other) == []


# Each package of the library and what it may import of the others (its __init__ says so
# too). Anything else of ours it imports is an arrow pointing the wrong way.
ALLOWED = {
    "flower.util": {"flower._errors"},
    "flower.docs": {"flower.util", "flower.i18n", "flower._errors"},
    "flower.cache": {"flower.util", "flower.i18n", "flower._errors"},
    # the cache's stores are the state's too; flower.cache imports nothing above util
    "flower.state": {"flower.cache", "flower.util", "flower.i18n", "flower._errors"},
    "flower.agents": {"flower.util", "flower.i18n", "flower._errors"},
    # the servers flower starts for a person (cluster up, the demo): product code, below
    # the test kit that uses them
    "flower.services": {"flower.util", "flower.i18n", "flower._errors"},
    "flower.people": {
        "flower.agents",
        "flower.state",
        "flower.util",
        "flower.i18n",
        "flower._errors",
    },
    "flower.step": {
        "flower.state",
        "flower.agents",
        "flower.people",
        "flower.docs",
        "flower.util",
        "flower.i18n",
        "flower._errors",
    },
}


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "flower" and len(parts) > 1 else parts[0]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_package_imports_only_what_its_layer_allows(layer: str) -> None:
    wrong = [
        e
        for e in _edges(layer, "flower")
        if _package(e.split(" -> ")[1]) not in {layer, *ALLOWED[layer]}
    ]
    assert wrong == []


def test_the_state_backends_know_nothing_of_the_step_machinery() -> None:
    for upper in ("flower.step", "flower.agents", "flower.people", "flower.workflow"):
        assert _edges("flower.state", upper) == []


def test_the_old_grab_bag_is_gone() -> None:
    assert not (REPO / "flower" / "core").exists()
    assert not (REPO / "flower" / "stores").exists()


def test_util_is_a_leaf() -> None:
    allowed = {"flower._errors"}
    outside = [e for e in _edges("flower.util", "flower") if e.split(" -> ")[1] not in allowed]
    assert [e for e in outside if not e.split(" -> ")[1].startswith("flower.util")] == []


@pytest.mark.parametrize("upper", ["supervisor", "stepproc"])
def test_the_library_never_imports_the_processes_above_it(upper: str) -> None:
    assert _edges("flower", upper) == []


def test_supervisor_uses_only_the_child_entry_point_of_stepproc() -> None:
    assert {e.split(" -> ")[1] for e in _edges("supervisor", "stepproc")} == {"stepproc"}
    entry = ast.parse((REPO / "stepproc" / "__init__.py").read_text(encoding="utf-8"))
    exported = next(
        n.value for n in entry.body if isinstance(n, ast.Assign) and n.targets[0].id == "__all__"
    )
    assert sorted(ast.literal_eval(exported)) == ["ChildSetup", "child_main"]


def test_stepproc_never_imports_the_supervisor() -> None:
    assert _edges("stepproc", "supervisor") == []


# Dynamic imports whose name is computed: each one's names are checked where they come from.
# flower's and flower.state.postgres's lazy names are relative to the package itself (the
# arrow test sees their targets through the TYPE_CHECKING imports beside them); the flow
# loader imports a person's flow (``--flow package.module:attr``), never a module of ours.
# flower.testing's lazy names are flower.services'; the forked placement preloads modules of
# anyio by name (ATTEMPT_MODULES), never ours.
COMPUTED = {
    "flower",
    "flower.state.postgres",
    "flower.testing",
    "supervisor.run.flows",
    "supervisor.run.placement",
}


def test_no_dynamic_import_escapes_the_arrows() -> None:
    """A dynamic import of a computed name is allowed only where it is reviewed (COMPUTED);
    one of a constant name counts in GRAPH like any import statement."""
    found = set()
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            call = _dynamic(node)
            if call is not None and not (call.args and isinstance(call.args[0], ast.Constant)):
                found.add(name)
    assert found <= COMPUTED, sorted(found - COMPUTED)


def test_a_dynamic_import_of_a_package_above_is_an_arrow_the_test_sees() -> None:
    source = 'import importlib\nimportlib.import_module("supervisor.run.start")\n'
    fake = REPO / "flower" / "util" / "_fake_for_the_layer_test.py"
    MODULES["flower.util._fake_for_the_layer_test"] = fake
    try:
        fake.write_text(source, encoding="utf-8")
        seen = set(_imports("flower.util._fake_for_the_layer_test", fake))
    finally:
        fake.unlink()
        del MODULES["flower.util._fake_for_the_layer_test"]
    assert seen == {"supervisor.run.start"}


# supervisor's rooms and which others each may import (its __init__ says so too).
ROOMS = {
    "supervisor.commands": {
        "supervisor.inspect",
        "supervisor.terminal",
        "supervisor.run",
        "supervisor.cluster",
        "supervisor.ui",
    },
    "supervisor.inspect": {"supervisor.terminal"},
    "supervisor.ui": {"supervisor.inspect"},
    "supervisor.terminal": set(),
    "supervisor.run": {"supervisor.terminal"},
    "supervisor.cluster": {"supervisor.run"},
}


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_room_of_supervisor_imports_only_what_it_may(room: str) -> None:
    wrong = [
        e
        for other in ROOMS
        if other != room and other not in ROOMS[room]
        for e in _edges(room, other)
    ]
    assert wrong == []


def test_supervisor_is_its_rooms_and_nothing_beside_them() -> None:
    loose = [
        n
        for n in MODULES
        if n.startswith("supervisor.") and n.split(".")[1] not in {r.split(".")[1] for r in ROOMS}
    ]
    assert loose == ["supervisor.__main__"]


def test_the_product_never_imports_its_test_harness() -> None:
    """flower.testing (and the tests) may use the product; nothing of the product uses them."""
    wrong = [
        e
        for source in ("flower", "supervisor", "stepproc", "ipc")
        for e in _edges(source, "flower.testing")
        if not e.startswith("flower.testing")
    ]
    assert wrong == []


# -- the run-state seam: nothing above it asks which backend it has ---------------------

OUTSIDE_STATE = {
    name: path
    for name, path in MODULES.items()
    # the servers (flower.services) and the test kit make databases: not run state
    if not name.startswith(("flower.state", "flower.testing", "flower.services"))
}
SQL = ("SELECT ", "INSERT ", "UPDATE ", "DELETE FROM", "CREATE TABLE", "CREATE DATABASE")


def _asks_the_backend(tree: ast.AST) -> list[int]:
    """Lines that read ``.kind`` of something named like a run state, or reach into a
    backend's rows (``state.rows``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("kind", "rows"):
            base = node.value
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            names = ("state", "st", "probe", "opened") if node.attr == "kind" else ("state",)
            if name in names:
                out.append(node.lineno)
    return out


def _state_typed_any(tree: ast.AST) -> list[int]:
    """Parameters and fields named ``state`` annotated ``Any``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg == "state":
            ann = node.annotation
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            ann = node.annotation if node.target.id == "state" else None
        else:
            continue
        if ann is not None and "Any" in ast.unparse(ann):
            out.append(node.lineno)
    return out


def _sql(tree: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.lstrip().startswith(SQL)
    ]


@pytest.mark.parametrize("check", [_asks_the_backend, _state_typed_any, _sql])
def test_nothing_above_the_state_seam_asks_which_backend_it_has(check: object) -> None:
    found = {
        f"{name}:{line}"
        for name, path in OUTSIDE_STATE.items()
        for line in check(ast.parse(path.read_text(encoding="utf-8")))  # type: ignore[operator]
    }
    assert not found, sorted(found)


def test_the_seam_checks_see_what_they_look_for() -> None:
    tree = ast.parse(
        "def f(state: Any):\n    if state.kind == 'local':\n        state.rows.events\n"
        "    q = 'SELECT 1'\n"
    )
    assert _asks_the_backend(tree) == [2, 3]
    assert _state_typed_any(tree) == [1]
    assert _sql(tree) == [4]
