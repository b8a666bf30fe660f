"""The locked versions and the newest ones (standard library; ``packaging`` when installed).

``requirements.lock`` pins every package flower, its tests and its checks install, with the
hashes of every file of each release (scripts/_venv.sh installs it with pip). ``bash
scripts/test.sh --latest`` runs the kill drills against the newest releases pyproject.toml
allows, in ``.venv-latest``; ``bash scripts/upgrade.sh`` moves the lock forward to them only
when that run passed, for exactly those versions. This script is their shared part:

    python scripts/pins.py sdk         # "claude-agent-sdk 0.2.189 (Claude Code 2.1.332)"
    python scripts/pins.py versions    # --latest's first lines: each direct dependency
    python scripts/pins.py verdict STATUS REPORT   # --latest's last line, and its verdict file
    python scripts/pins.py may-upgrade [--newest LOCK]   # upgrade.sh: may the lock move?
    python scripts/pins.py tidy LOCK   # upgrade.sh: the lock as committed
    python scripts/pins.py changes OLD NEW   # upgrade.sh: what moved

The verdict file (``.venv-latest/verdict.json``) says PASS or FAIL, whether all the drills
ran or a subset, the version of each direct dependency and of the CLI the SDK bundles, and
the pyproject.toml it was for; ``.venv-latest/tested.txt`` beside it is the whole venv's
``pip freeze``, which upgrade.sh locks (so the lock holds what was tested, not what is newest
by the time it runs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "requirements.lock"
LATEST = ROOT / ".venv-latest"
VERDICT = LATEST / "verdict.json"
TESTED = LATEST / "tested.txt"
SDK = "claude-agent-sdk"
FIRST = (SDK, "temporalio", "psycopg")
# Where a line of upgrade.sh's refusal sends a person.
RUN_LATEST = "run bash scripts/test.sh --latest first"

# "claude-agent-sdk==0.2.189 \" or "colorama==0.4.6 ; sys_platform == 'win32' \"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]*?))?\s*\\?$")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def direct() -> list[tuple[str, str, bool]]:
    """pyproject.toml's direct dependencies: ``(name, requirement, runtime?)``: the SDK,
    temporalio and psycopg, then the others in its order (the ``test`` and ``dev`` extras
    last)."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    out: list[tuple[str, str, bool]] = []
    groups = [(project["dependencies"], True)]
    groups += [(project["optional-dependencies"][extra], False) for extra in ("test", "dev")]
    for requirements, runtime in groups:
        for requirement in requirements:
            found = _NAME.match(requirement)
            assert found, requirement
            out.append((canonical(found[1]), requirement, runtime))
    # The ones that break the drills first, first.
    return sorted(out, key=lambda d: FIRST.index(d[0]) if d[0] in FIRST else len(FIRST))


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def claude_code() -> str | None:
    """The version of the Claude Code CLI bundled in the installed SDK wheel
    (``claude_agent_sdk/_bundled/claude.version``: "2.1.332 (Claude Code)")."""
    try:
        where = metadata.distribution(SDK).locate_file("claude_agent_sdk/_bundled/claude.version")
        return Path(str(where)).read_text(encoding="utf-8").split()[0]
    except (metadata.PackageNotFoundError, OSError, IndexError):
        return None


def sdk_line(version: str | None, cli: str | None) -> str:
    return f"{SDK} {version or '(not installed)'}" + (f" (Claude Code {cli})" if cli else "")


def locked(path: Path = LOCK) -> dict[str, str]:
    """``{name: version}`` of a lock, for this interpreter and platform (a package pinned
    twice under different markers: the line whose markers hold here)."""
    try:
        from packaging.markers import Marker
    except ImportError:  # the system's python3: take a line whatever its markers say
        Marker = None  # type: ignore[assignment,misc]
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        pin = _PIN.match(line)
        if not pin:
            continue
        name, version, markers = canonical(pin[1]), pin[2], pin[3]
        if markers and Marker is not None and not Marker(markers).evaluate():
            continue
        out.setdefault(name, version)
    return out


def newest_published(name: str) -> str | None:
    """The newest release on the index, whatever pyproject.toml's range (``pip index``)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", name],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(rf"^{re.escape(name)} \(([^)]+)\)", done.stdout, re.I | re.M)
    return found[1] if found else None


def pyproject_hash() -> str:
    return hashlib.sha256(PYPROJECT.read_bytes()).hexdigest()


def versions() -> dict[str, str | None]:
    return {name: installed(name) for name, _, _ in direct()}


def summary(found: dict[str, str | None], cli: str | None, runtime_only: bool = True) -> str:
    """ "claude-agent-sdk 0.2.190 (Claude Code 2.1.337), temporalio 1.35.0, …"."""
    runtime = {name for name, _, is_runtime in direct() if is_runtime}
    parts = [sdk_line(found.get(SDK), cli)]
    parts += [
        f"{name} {version}"
        for name, version in found.items()
        if name != SDK and (name in runtime or not runtime_only)
    ]
    return ", ".join(parts)


# -- the commands ------------------------------------------------------------------------------


def cmd_sdk(_: argparse.Namespace) -> int:
    print(sdk_line(installed(SDK), claude_code()))
    return 0


def cmd_versions(_: argparse.Namespace) -> int:
    """What --latest tests, one line each, with the lock's version where it differs and a
    newer release that pyproject.toml's range leaves out (runtime dependencies)."""
    lock = locked()
    deps = direct()
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = pool.map(lambda d: newest_published(d[0]) if d[2] else None, deps)
        newest = dict(zip(deps, found, strict=True))
    for dep in deps:
        name, requirement, _ = dep
        version = installed(name)
        line = sdk_line(version, claude_code()) if name == SDK else f"{name} {version}"
        notes = []
        if lock.get(name) and lock[name] != version:
            notes.append(f"the lock has {lock[name]}")
        if newest[dep] and version and newest[dep] != version:
            notes.append(f"{newest[dep]} is out, outside pyproject.toml's {requirement!r}")
        print(f"latest: {line}" + (f"   ({'; '.join(notes)})" if notes else ""))
    return 0


def cmd_verdict(args: argparse.Namespace) -> int:
    """Write .venv-latest/verdict.json and tested.txt; print the one-line verdict."""
    ran = Path(args.report) if args.report else None
    report = json.loads(ran.read_text(encoding="utf-8")) if ran and ran.is_file() else {}
    found = versions()
    cli = claude_code()
    counts = report.get("counts", {})
    failed_tests = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    passed = args.status == 0 and bool(report) and not report.get("failed")
    subset = not report.get("drills", False)
    verdict = {
        "verdict": "PASS" if passed else "FAIL",
        "subset": subset,
        "files": report.get("files", []),
        "failed_files": report.get("failed", []),
        "failed_tests": failed_tests,
        "counts": counts,
        "versions": found,
        "claude_code": cli,
        "pyproject_sha256": pyproject_hash(),
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    TESTED.write_text(freeze, encoding="utf-8")
    VERDICT.write_text(json.dumps(verdict, indent=2) + "\n", encoding="utf-8")
    what = summary(found, cli)
    if not passed:
        why = f"{failed_tests} failed" if failed_tests else f"exit status {args.status}"
        if report.get("failed"):
            why += ": " + ", ".join(report["failed"])
        print(f"latest: FAIL — {what} ({why}) — keep the lock")
    elif subset:
        n = len(report.get("files", []))
        print(
            f"latest: PASS, a subset ({n} file{'s' * (n != 1)}, not all the drills) — {what}"
            " — a subset cannot move the lock: bash scripts/test.sh --latest"
        )
    elif all(locked().get(name) == version for name, version in found.items()):
        print(f"latest: PASS — {what} — the lock has these versions already")
    else:
        print(f"latest: PASS — {what} — the lock can move forward: bash scripts/upgrade.sh")
    return 0


def cmd_may_upgrade(args: argparse.Namespace) -> int:
    """Exit 0 when the last --latest run passed all the drills for this pyproject.toml and
    (with --newest) for exactly the direct versions of that freshly compiled lock; else one
    line on stderr saying why not, exit 1."""

    def refuse(why: str) -> int:
        print(f"{RUN_LATEST}: {why}", file=sys.stderr)
        return 1

    if not VERDICT.is_file() or not TESTED.is_file():
        shown = VERDICT.relative_to(ROOT) if VERDICT.is_relative_to(ROOT) else VERDICT
        return refuse(f"there is no verdict of a --latest run ({shown})")
    verdict = json.loads(VERDICT.read_text(encoding="utf-8"))
    tested = verdict.get("versions", {})
    if verdict.get("verdict") != "PASS":
        failed = ", ".join(verdict.get("failed_files", [])) or "see its output"
        return refuse(f"its last run failed ({failed}), for {summary(tested, None)}")
    if verdict.get("subset", True):
        n = len(verdict.get("files", []))
        return refuse(f"its last run was a subset ({n} file{'s' * (n != 1)}, not all the drills)")
    if verdict.get("pyproject_sha256") != pyproject_hash():
        return refuse("its last run is for another pyproject.toml (it changed since)")
    if args.newest:
        newest = locked(Path(args.newest))
        moved = [
            f"{name} {tested.get(name)} tested, {newest.get(name)} is the newest now"
            for name, _, _ in direct()
            if newest.get(name) != tested.get(name)
        ]
        if moved:
            return refuse("its last run is for other versions: " + "; ".join(moved))
    return 0


def cmd_tidy(args: argparse.Namespace) -> int:
    """The lock as committed: the tested versions' constraint file (``-c``) left out of the
    ``# via`` notes (every package has one), and a word on how it is used after the header."""
    path = Path(args.lock)
    lines = path.read_text(encoding="utf-8").splitlines()
    out = [line for line in lines if not re.match(r"^\s*#\s+(via )?-c ", line)]
    # "# via" with nothing under it any more
    out = [
        line
        for i, line in enumerate(out)
        if not (
            line.strip() == "# via"
            and not (i + 1 < len(out) and out[i + 1].lstrip().startswith("#   "))
        )
    ]
    header = 0
    while header < len(out) and out[header].startswith("#"):
        header += 1
    note = [
        "# Every package flower and its `test`/`dev` extras need, for every platform and",
        "# CPython 3.11+, with the hashes of every file of each release (PyPI's). Installed by",
        "# scripts/_venv.sh with pip --require-hashes; moved forward only by",
        "# scripts/upgrade.sh, after `bash scripts/test.sh --latest` passed for these versions.",
    ]
    path.write_text("\n".join(out[:header] + note + out[header:]) + "\n", encoding="utf-8")
    return 0


def cmd_changes(args: argparse.Namespace) -> int:
    old, new = locked(Path(args.old)), locked(Path(args.new))
    moved = [
        f"  {name} {old.get(name, '-')} -> {new.get(name, '-')}"
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]
    print("\n".join(moved) if moved else "  (no version moved)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sdk").set_defaults(run=cmd_sdk)
    sub.add_parser("versions").set_defaults(run=cmd_versions)
    verdict = sub.add_parser("verdict")
    verdict.add_argument("status", type=int, help="scripts/run_tests.py's exit status")
    verdict.add_argument("report", nargs="?", help="its --report file")
    verdict.set_defaults(run=cmd_verdict)
    may = sub.add_parser("may-upgrade")
    may.add_argument("--newest", help="a lock compiled with the newest releases")
    may.set_defaults(run=cmd_may_upgrade)
    tidy = sub.add_parser("tidy")
    tidy.add_argument("lock")
    tidy.set_defaults(run=cmd_tidy)
    changes = sub.add_parser("changes")
    changes.add_argument("old")
    changes.add_argument("new")
    changes.set_defaults(run=cmd_changes)
    args = parser.parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
