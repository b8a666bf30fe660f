"""Fingerprints: what the outside world looks like to a step, as short stable strings.

A cross-run cache entry is keyed on a step's input hash *and* its resolved fingerprints
(seed 004, 跨运行记忆化), so a changed world is always a miss. Each entry names one signal:

- ``git:HEAD`` / ``git:<ref>``: the commit id (``git rev-parse --verify <ref>^{commit}`` in
  the workspace).
- ``glob:PATTERN``: size and ``mtime_ns`` of every file that matches.
- ``glob!:PATTERN``: the sha256 of every matching file's content (a ``touch -m`` leaves it
  alone; a rewrite that keeps the mtime does not).
- ``file:PATH``: the sha256 of one file's content.
- ``env:NAME``: the variable's value, hashed, so a secret never lands in a key file in clear.

Paths and patterns are relative to the workspace and stay inside it (no absolute path, no
``..``). Patterns follow :meth:`pathlib.Path.glob`: ``*`` matches dotfiles too, ``**`` is any
number of directories and never descends through a symlinked directory, matching is
case-sensitive; a pattern that ends in ``**`` means every file below. Only regular files
count (directories, fifos and sockets are skipped); a symlink is followed only when its
target is inside the workspace, else it enters as ``<outside workspace>``.

:func:`resolve` never raises: a missing file, no git, a bad ref, an unreadable file each
give a fixed placeholder (:data:`MISSING`, :data:`NO_GIT`, …), so a fingerprint can only
ever cause a miss, never a failed run. A pattern matching more than :data:`MAX_MATCHES`
files is not fingerprinted file by file: its value is ``<over 10000 matches: N>`` (N the
count, up to :data:`MAX_LISTED`), which moves when files come or go but not when one
changes: narrow such a pattern. A file over :data:`MAX_HASH_BYTES` is not read; it enters
by its size (``size:N``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import stat
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

PREFIXES = ("git:", "glob:", "glob!:", "file:", "env:")

MAX_MATCHES = 10_000  # files one glob entry fingerprints one by one
MAX_LISTED = 1_000_000  # beyond this a glob stops counting (a pattern over a whole disk)
MAX_HASH_BYTES = 10 * 1024 * 1024  # content hashed up to here; a bigger file enters by size
GIT_TIMEOUT_S = 10.0

MISSING = "<missing>"
NOT_A_FILE = "<not a file>"
UNREADABLE = "<unreadable>"
OUTSIDE = "<outside workspace>"
NO_GIT = "<no git>"
BAD_REF = "<bad ref>"
GIT_TIMEOUT = "<git timeout>"
UNSET = "<unset>"
INVALID = "<invalid>"
FAILED = "<error>"

_CHUNK = 1024 * 1024
_RFLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)  # a fifo must not block the open
_MAGIC = re.compile(r"[*?[]")


def check_entry(entry: object) -> str | None:
    """The one-line problem with a fingerprint entry, or None when it is valid."""
    if not isinstance(entry, str):
        return f"fingerprint entry must be a string, got {type(entry).__name__}"
    prefix = next((p for p in PREFIXES if entry.startswith(p)), None)
    if prefix is None:
        known = ", ".join(PREFIXES)
        head, colon, _ = entry.partition(":")
        if not colon:
            return f"fingerprint entry {entry!r} has no prefix (known: {known})"
        return f"unknown fingerprint prefix {head + ':'!r} (known: {known})"
    rest = entry[len(prefix) :]
    if not rest.strip():
        return f"fingerprint entry {entry!r} is empty after {prefix!r}"
    if "\0" in rest:
        return f"fingerprint entry {entry!r} contains a NUL character"
    if prefix == "git:":
        if rest.startswith("-") or any(c.isspace() or ord(c) < 32 for c in rest):
            return f"fingerprint entry {entry!r}: {rest!r} is not a git ref"
    elif prefix == "env:":
        if "=" in rest:
            return f"fingerprint entry {entry!r}: a variable name cannot contain '='"
    else:
        return _check_path(entry, rest, glob=prefix != "file:")
    return None


def _check_path(entry: str, rest: str, *, glob: bool) -> str | None:
    what = "pattern" if glob else "path"
    if rest.startswith("/"):
        return f"fingerprint entry {entry!r}: the {what} must be relative to the workspace"
    parts = rest.split("/")
    if ".." in parts:
        return f"fingerprint entry {entry!r}: the {what} must not leave the workspace ('..')"
    if glob and any("**" in p and p != "**" for p in parts):
        return f"fingerprint entry {entry!r}: '**' must be a whole path component"
    if not glob and not [p for p in parts if p not in ("", ".")]:
        return f"fingerprint entry {entry!r} names no file"
    return None


def resolve(entry: str, workspace: Path) -> str:
    """The entry's current value in ``workspace``; never raises (see the module's notes)."""
    try:
        if check_entry(entry) is not None:
            return INVALID
        ws = os.fspath(workspace)
        prefix, _, rest = entry.partition(":")
        if prefix == "git":
            return _git(rest, ws)
        if prefix == "env":
            return _env(rest)
        if prefix == "file":
            return _file(rest, ws)
        return _glob(rest, ws, content=prefix == "glob!")
    except Exception:  # noqa: BLE001 - a fingerprint may cause a miss, never a failed run
        return FAILED


def resolve_all(entries: Iterable[str], workspace: Path) -> dict[str, str]:
    """``{entry: resolve(entry, workspace)}`` for every entry (a repeated one counts once)."""
    return {entry: resolve(entry, workspace) for entry in dict.fromkeys(entries)}


def fingerprint_digest(resolved: dict[str, str]) -> str:
    """The sha256 hex of the sorted ``(entry, value)`` pairs: one string for a cache key."""
    text = json.dumps(sorted(resolved.items()), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# --- git: and env: ---


def _git(ref: str, ws: str) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            cwd=ws,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return GIT_TIMEOUT
    except OSError:  # no git binary, or the workspace is gone
        return NO_GIT
    if done.returncode == 0:
        return done.stdout.decode("ascii", "replace").strip() or BAD_REF
    # --quiet: a ref that does not name a commit exits 1 silently; no repository (or one
    # git refuses, e.g. dubious ownership) exits 128 with a fatal line.
    return BAD_REF if done.returncode == 1 else NO_GIT


def _env(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        return UNSET
    # Named in the hash, so two variables with the same secret do not share a value.
    raw = f"flower env:{name}\0{value}".encode("utf-8", "surrogateescape")
    return "sha256:" + hashlib.sha256(raw).hexdigest()


# --- file: and file contents ---


def _file(rel: str, ws: str) -> str:
    path = os.path.join(ws, rel)
    if not _inside(path, os.path.realpath(ws)):
        return OUTSIDE
    return _content(path) or NOT_A_FILE


def _inside(path: str, real_ws: str) -> bool:
    real = os.path.realpath(path)
    return real == real_ws or real.startswith(real_ws.rstrip(os.sep) + os.sep)


def _content(path: str) -> str | None:
    """sha256 hex of a regular file, ``size:N`` past the limit, a placeholder on error;
    None when ``path`` is not a regular file (a directory, a fifo)."""
    try:
        fd = os.open(path, _RFLAGS)
    except FileNotFoundError:
        return MISSING
    except OSError:
        return UNREADABLE
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        size = st.st_size
        if size > MAX_HASH_BYTES:
            return f"size:{size}"
        if size > _CHUNK:
            return _content_chunked(fd, b"")
        # One read of size+1 bytes: getting exactly ``size`` back is the end of a regular
        # file, so a small file costs open, fstat, one read and close, the least a content
        # hash can (scripts/bench_memo_glob.py measures it against a plain hashlib loop).
        data = os.read(fd, size + 1)
        if len(data) == size:
            return hashlib.sha256(data).hexdigest()
        return _content_chunked(fd, data)  # it grew or shrank since the fstat
    except OSError:
        return UNREADABLE
    finally:
        os.close(fd)


def _content_chunked(fd: int, first: bytes) -> str:
    h = hashlib.sha256(first)
    total = len(first)
    while chunk := os.read(fd, _CHUNK):
        total += len(chunk)
        if total > MAX_HASH_BYTES:  # it grew past the limit while we read
            return f"size:{os.fstat(fd).st_size}"
        h.update(chunk)
    return h.hexdigest()


# --- glob: and glob!: ---


class _TooMany(Exception):
    pass


class _Found:
    """The matches of one pattern: ``rel -> (path, entry or None, reached through a link)``.

    Stores at most MAX_MATCHES; past that it only counts (repeats too: deterministic)."""

    __slots__ = ("count", "items")

    def __init__(self) -> None:
        self.items: dict[str, tuple[str, os.DirEntry[str] | None, bool]] = {}
        self.count = 0

    def add(self, rel: str, path: str, entry: os.DirEntry[str] | None, linked: bool) -> None:
        if rel in self.items:
            return
        self.count += 1
        if self.count <= MAX_MATCHES:
            self.items[rel] = (path, entry, linked)
        elif self.count > MAX_LISTED:
            raise _TooMany


_Segment = str | Callable[[str], object] | None  # literal name | compiled match | "**"


def _segments(pattern: str) -> list[_Segment]:
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    if not parts or parts[-1] == "**":
        parts.append("*")  # a pattern ending in ** means every file below
    out: list[_Segment] = []
    for p in parts:
        if p == "**":
            if out and out[-1] is None:
                continue  # **/** is **
            out.append(None)
        elif _MAGIC.search(p):
            out.append(re.compile(fnmatch.translate(p)).match)
        else:
            out.append(p)
    return out


def _scan(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:  # vanished, not a directory, no permission: nothing below it
        return []


class _Walker:
    def __init__(self, segments: list[_Segment], found: _Found) -> None:
        self.segments = segments
        self.found = found

    def select(
        self,
        path: str,
        rel: str,
        i: int,
        linked: bool,
        entries: list[os.DirEntry[str]] | None = None,
    ) -> None:
        """Add the matches of segments[i:] below directory ``path`` (``rel`` its name in
        the workspace, ``""`` or ending in ``/``); ``entries``: its listing, if known."""
        seg = self.segments[i]
        last = i == len(self.segments) - 1
        if seg is None:
            self._recurse(path, rel, i + 1, linked, entries)
        elif isinstance(seg, str):
            child = os.path.join(path, seg)
            if last:
                try:
                    is_file = stat.S_ISREG(os.stat(child).st_mode)
                except (OSError, ValueError):
                    return
                if is_file:
                    self.found.add(rel + seg, child, None, linked or os.path.islink(child))
            elif os.path.isdir(child):
                self.select(child, f"{rel}{seg}/", i + 1, linked or os.path.islink(child))
        else:
            for e in _scan(path) if entries is None else entries:
                if not seg(e.name):
                    continue
                if last:
                    if e.is_file():
                        self.found.add(rel + e.name, e.path, e, linked or e.is_symlink())
                elif e.is_dir():
                    link = linked or e.is_symlink()
                    self.select(e.path, f"{rel}{e.name}/", i + 1, link)

    def _recurse(
        self,
        path: str,
        rel: str,
        i: int,
        linked: bool,
        entries: list[os.DirEntry[str]] | None,
    ) -> None:
        # ``**`` at ``path``: the rest of the pattern here and in every directory below,
        # listing each directory once, never through a symlinked one (as pathlib).
        listing = _scan(path) if entries is None else entries
        self.select(path, rel, i, linked, listing)
        for e in listing:
            if e.is_dir(follow_symlinks=False):
                self._recurse(e.path, f"{rel}{e.name}/", i, linked, None)


def _glob(pattern: str, ws: str, *, content: bool) -> str:
    found = _Found()
    try:
        _Walker(_segments(pattern), found).select(ws, "", 0, False)
    except _TooMany:
        return f"<over {MAX_MATCHES} matches: over {MAX_LISTED}>"
    except RecursionError:  # a tree deeper than Python's stack: say so, stay stable
        return f"<over {MAX_MATCHES} matches: too deep>"
    if found.count > MAX_MATCHES:
        return f"<over {MAX_MATCHES} matches: {found.count}>"
    if not found.items:
        return "0 files"
    real_ws: str | None = None
    h = hashlib.sha256()
    n = 0
    for rel in sorted(found.items):
        path, entry, linked = found.items[rel]
        if linked:
            if real_ws is None:
                real_ws = os.path.realpath(ws)
            if not _inside(path, real_ws):
                h.update(f"{rel}\0{OUTSIDE}\n".encode("utf-8", "surrogateescape"))
                n += 1
                continue
        value = _content(path) if content else _size_mtime(path, entry)
        if value is None:  # it became a directory between the listing and now
            continue
        h.update(f"{rel}\0{value}\n".encode("utf-8", "surrogateescape"))
        n += 1
    return f"{n} {'file' if n == 1 else 'files'} {h.hexdigest()}"


def _size_mtime(path: str, entry: os.DirEntry[str] | None) -> str:
    try:
        st = entry.stat() if entry is not None else os.stat(path)
    except FileNotFoundError:
        return MISSING
    except OSError:
        return UNREADABLE
    return f"{st.st_size}:{st.st_mtime_ns}"
