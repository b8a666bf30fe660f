"""Owner-only files and atomic replacement.

Files in the run_dir hold whole transcripts, so everything flower creates there is readable
by its owner only: directories 0700, files 0600. Writers that must never leave half a file
behind (lineage.json, registry records) go through :func:`atomic_write_text`.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


MAX_NAME_BYTES = 200  # below the 255 bytes of a file name, leaving room for suffixes


def file_name(name: str) -> str:
    """``name`` (a step name, a label) as one file name that stays in its folder.

    Path separators, NUL and other control characters become ``_``; a name of dots only
    (``.``, ``..``) becomes underscores; a name longer than :data:`MAX_NAME_BYTES` bytes is
    cut (on a character boundary) and given a digest of the whole, so two long names that
    share a beginning stay two files. Never empty.
    """
    import hashlib

    out = "".join("_" if c in "/\\" or ord(c) < 32 or ord(c) == 127 else c for c in name)
    if not out.strip("."):
        out = out.replace(".", "_") or "_"
    raw = out.encode("utf-8")
    if len(raw) > MAX_NAME_BYTES:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        cut = raw[: MAX_NAME_BYTES - 13].decode("utf-8", "ignore")
        out = f"{cut}~{digest}"
    return out


def inside(folder: str | Path, name: str, suffix: str = "") -> Path:
    """``folder / (file_name(name) + suffix)``, checked to be directly inside ``folder``
    (the suffix, e.g. ``.md``, survives the cut of a long name)."""
    base = Path(folder)
    path = base / (file_name(name) + suffix)
    if path.parent != base or path.name in ("", ".", ".."):
        raise ValueError(f"{name!r} does not name a file inside {base}")
    return path


def private_dir(path: str | Path) -> Path:
    """Create ``path`` (and parents) as owner-only directories; return it as a Path.

    An existing directory keeps the permissions its owner gave it.
    """
    p = Path(path)
    if p.is_dir():
        return p
    missing = []
    q = p
    while not q.is_dir():
        missing.append(q)
        if q.parent == q:
            break
        q = q.parent
    for d in reversed(missing):  # each level we create is owner-only, not just the last
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:
            if not d.is_dir():
                raise
            continue
        with contextlib.suppress(OSError):
            os.chmod(d, DIR_MODE)  # mkdir's mode is filtered by the umask
    return p


RUN_DIR_GITIGNORE = "# flower's run directory: whole transcripts, never for version control.\n*\n"


def private_run_dir(path: str | Path) -> Path:
    """:func:`private_dir` for a run_dir: when this call creates it, it gets a ``.gitignore``
    of ``*`` as well, so the transcripts in it never end up in a commit by accident (a
    ``git add .`` in the workspace skips it). An existing run_dir is left as it is."""
    p = Path(path)
    if p.is_dir():
        return p
    private_dir(p)
    with contextlib.suppress(OSError):  # a run_dir without it still works
        fd = open_private(p / ".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(RUN_DIR_GITIGNORE)
    return p


def open_private(path: str | Path, flags: int) -> int:
    """``os.open`` that creates files 0600 whatever the umask says."""
    fd = os.open(path, flags, FILE_MODE)
    if flags & os.O_CREAT:
        with contextlib.suppress(OSError):
            os.fchmod(fd, FILE_MODE)
    return fd


def fsync_dir(path: str | Path) -> None:
    """Make a rename in ``path`` durable; best-effort (not every filesystem allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str, *, durable: bool = True) -> None:
    """Write ``text`` to ``path`` through a sibling temp file and ``os.replace``.

    A process killed at any instant leaves either the old file or the new one, never half
    of either. Raises OSError; callers that must not fail (lineage) swallow it.
    """
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    data = text.encode("utf-8")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, p)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(p.parent)


def set_aside(path: str | Path, reason: str = "corrupt") -> Path:
    """Move a damaged file beside itself as ``<name>.<reason>-<YYYYmmdd-HHMMSS>[-N]``; return
    the new path.

    Never deletes: the bytes stay exactly as they were for a person to inspect.
    """
    p = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = p.with_name(f"{p.name}.{reason}-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = p.with_name(f"{p.name}.{reason}-{stamp}-{n}")
    os.replace(p, target)
    return target


def _unlink_quietly(p: Path) -> None:
    with contextlib.suppress(OSError):
        p.unlink()
