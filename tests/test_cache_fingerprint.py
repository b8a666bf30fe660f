"""Fingerprints (seed 004): each entry's value moves exactly when its signal does, and
resolving one never raises — a missing file, no git, a bad ref are fixed placeholders."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flower.cache import (
    MAX_HASH_BYTES,
    PREFIXES,
    check_entry,
    fingerprint_digest,
    resolve,
    resolve_all,
)
from flower.cache import fingerprint as fp


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A workspace no git repository above it can claim."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    w = tmp_path / "ws"
    w.mkdir()
    return w


def git(ws: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def commit(ws: Path, name: str, text: str) -> str:
    (ws / name).write_text(text)
    git(ws, "add", name)
    git(ws, "commit", "-q", "-m", name)
    return git(ws, "rev-parse", "HEAD")


def write(path: Path, data: bytes, mtime_ns: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


# --- check_entry ---


@pytest.mark.parametrize(
    "entry",
    ["git:HEAD", "git:main~1", "glob:src/**/*.ts", "glob!:**", "file:package.json", "env:CI"],
)
def test_valid_entries_have_no_problem(entry: str) -> None:
    assert check_entry(entry) is None


def test_an_unknown_prefix_names_it_and_the_known_ones() -> None:
    assert check_entry("foo:bar") == (
        "unknown fingerprint prefix 'foo:' (known: git:, glob:, glob!:, file:, env:)"
    )
    assert PREFIXES == ("git:", "glob:", "glob!:", "file:", "env:")


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("HEAD", "has no prefix"),
        ("glob:", "is empty"),
        ("file:  ", "is empty"),
        ("env:", "is empty"),
        ("glob:../x/*", "must not leave the workspace"),
        ("file:a/../../x", "must not leave the workspace"),
        ("glob:/etc/*", "relative to the workspace"),
        ("glob:src/a**/*.ts", "whole path component"),
        ("file:./", "names no file"),
        ("git:--exec=x", "is not a git ref"),
        ("git:a b", "is not a git ref"),
        ("env:A=B", "cannot contain '='"),
        ("file:a\0b", "NUL"),
    ],
)
def test_each_bad_entry_gets_one_line_naming_it(entry: str, words: str) -> None:
    problem = check_entry(entry)
    assert problem is not None and words in problem and "\n" not in problem


def test_a_non_string_entry_is_a_problem_not_a_crash() -> None:
    assert check_entry(3) == "fingerprint entry must be a string, got int"


def test_an_invalid_entry_resolves_to_a_placeholder(ws: Path) -> None:
    assert resolve("foo:bar", ws) == "<invalid>"
    assert resolve("glob:../*", ws) == "<invalid>"


# --- git: ---


def test_git_head_is_the_commit_and_a_new_commit_moves_it(ws: Path) -> None:
    git(ws, "init", "-q", "-b", "main")
    first = commit(ws, "a.txt", "one")
    assert resolve("git:HEAD", ws) == first
    second = commit(ws, "a.txt", "two")
    assert second != first
    assert resolve("git:HEAD", ws) == second
    assert resolve("git:main", ws) == second
    assert resolve("git:HEAD~1", ws) == first


def test_git_reads_packed_refs_and_peels_an_annotated_tag(ws: Path) -> None:
    git(ws, "init", "-q", "-b", "main")
    head = commit(ws, "a.txt", "one")
    git(ws, "tag", "-a", "-m", "v1", "v1")
    git(ws, "pack-refs", "--all")
    assert resolve("git:main", ws) == head
    assert resolve("git:v1", ws) == head  # the commit, not the tag object


def test_git_from_a_subdirectory_of_the_repository(ws: Path) -> None:
    git(ws, "init", "-q")
    head = commit(ws, "a.txt", "one")
    sub = ws / "sub"
    sub.mkdir()
    assert resolve("git:HEAD", sub) == head


def test_a_bad_ref_and_an_unborn_head_are_the_bad_ref_placeholder(ws: Path) -> None:
    git(ws, "init", "-q")
    assert resolve("git:HEAD", ws) == "<bad ref>"  # no commit yet
    commit(ws, "a.txt", "one")
    assert resolve("git:no-such-branch", ws) == "<bad ref>"
    assert resolve("git:HEAD:a.txt", ws) == "<bad ref>"  # a blob, not a commit


def test_no_repository_and_no_git_binary_are_the_no_git_placeholder(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve("git:HEAD", ws) == "<no git>"
    assert resolve("git:HEAD", ws / "gone") == "<no git>"
    git(ws, "init", "-q")
    commit(ws, "a.txt", "one")
    monkeypatch.setenv("PATH", str(ws / "empty-bin"))
    assert resolve("git:HEAD", ws) == "<no git>"


# --- glob: and glob!: ---


def test_glob_moves_on_touch_while_glob_bang_does_not(ws: Path) -> None:
    write(ws / "src/a.ts", b"alpha", mtime_ns=1_000_000_000)
    before = resolve_all(["glob:src/**/*.ts", "glob!:src/**/*.ts"], ws)
    os.utime(ws / "src/a.ts", ns=(2_000_000_000, 2_000_000_000))  # touch -m
    after = resolve_all(["glob:src/**/*.ts", "glob!:src/**/*.ts"], ws)
    assert after["glob:src/**/*.ts"] != before["glob:src/**/*.ts"]
    assert after["glob!:src/**/*.ts"] == before["glob!:src/**/*.ts"]


def test_glob_bang_moves_on_new_content_that_keeps_size_and_mtime(ws: Path) -> None:
    write(ws / "src/a.ts", b"alpha", mtime_ns=1_000_000_000)
    before = resolve_all(["glob:src/**/*.ts", "glob!:src/**/*.ts"], ws)
    write(ws / "src/a.ts", b"gamma", mtime_ns=1_000_000_000)
    after = resolve_all(["glob:src/**/*.ts", "glob!:src/**/*.ts"], ws)
    assert after["glob:src/**/*.ts"] == before["glob:src/**/*.ts"]  # same size and mtime
    assert after["glob!:src/**/*.ts"] != before["glob!:src/**/*.ts"]


def test_glob_counts_files_recursively_skips_directories_and_sees_dotfiles(ws: Path) -> None:
    write(ws / "src/a.ts", b"a")
    write(ws / "src/deep/er/b.ts", b"b")
    write(ws / "src/.hidden.ts", b"h")
    write(ws / "src/c.py", b"c")
    (ws / "src/dir.ts").mkdir()
    assert resolve("glob!:src/**/*.ts", ws).startswith("3 files ")
    assert resolve("glob!:src/*.ts", ws).startswith("2 files ")
    assert resolve("glob!:src/**", ws).startswith("4 files ")  # a trailing ** is every file
    assert resolve("glob:nothing/**/*.ts", ws) == "0 files"
    assert resolve("glob:src/c.py", ws).startswith("1 file ")


def test_a_new_or_removed_file_moves_both(ws: Path) -> None:
    write(ws / "a.ts", b"a", mtime_ns=10**9)
    entries = ["glob:*.ts", "glob!:*.ts"]
    one = resolve_all(entries, ws)
    write(ws / "b.ts", b"", mtime_ns=10**9)
    two = resolve_all(entries, ws)
    (ws / "b.ts").unlink()
    assert all(one[e] != two[e] for e in entries)
    assert resolve_all(entries, ws) == one


def test_glob_values_do_not_depend_on_creation_order_or_workspace_path(tmp_path: Path) -> None:
    names = [f"d{i % 3}/f{i}.txt" for i in range(30)]
    a, b = tmp_path / "a", tmp_path / "b"
    for ws, order in ((a, names), (b, names[::-1])):
        for n in order:
            write(ws / n, n.encode(), mtime_ns=5 * 10**9)
    for entry in ("glob:**/*.txt", "glob!:**/*.txt"):
        assert resolve(entry, a) == resolve(entry, b)


def test_a_pattern_over_the_bound_says_so_with_its_count(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fp, "MAX_MATCHES", 3)
    for i in range(5):
        write(ws / f"f{i}.txt", b"x")
    assert resolve("glob!:*.txt", ws) == "<over 3 matches: 5>"
    assert resolve("glob:*.txt", ws) == "<over 3 matches: 5>"
    write(ws / "f0.txt", b"changed")  # one file's change is not seen past the bound
    assert resolve("glob!:*.txt", ws) == "<over 3 matches: 5>"
    write(ws / "f5.txt", b"x")
    assert resolve("glob!:*.txt", ws) == "<over 3 matches: 6>"


def test_a_file_over_10_mb_enters_by_size_without_being_read(ws: Path) -> None:
    big = ws / "big.bin"
    with open(big, "wb") as f:  # sparse: no 10 MB written to the shared disk
        f.truncate(MAX_HASH_BYTES + 1)
    before = resolve_all(["glob!:*.bin", "file:big.bin"], ws)
    assert before["file:big.bin"] == f"size:{MAX_HASH_BYTES + 1}"
    with open(big, "r+b") as f:
        f.write(b"new content, same size")
    assert resolve_all(["glob!:*.bin", "file:big.bin"], ws) == before
    with open(big, "r+b") as f:
        f.truncate(MAX_HASH_BYTES)  # exactly the limit: hashed
    exact = resolve("file:big.bin", ws)
    assert exact == hashlib.sha256(big.read_bytes()).hexdigest()


def test_a_fifo_is_skipped_and_never_blocks(ws: Path) -> None:
    write(ws / "a.txt", b"a")
    os.mkfifo(ws / "pipe.txt")
    assert resolve("glob!:*.txt", ws).startswith("1 file ")
    assert resolve("file:pipe.txt", ws) == "<not a file>"


def test_symlinks_are_followed_inside_the_workspace_only(tmp_path: Path, ws: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_bytes(b"outside")
    write(ws / "real.txt", b"inside")
    (ws / "in.txt").symlink_to(ws / "real.txt")
    (ws / "out.txt").symlink_to(outside)
    (ws / "outdir").symlink_to(tmp_path, target_is_directory=True)
    assert resolve("file:in.txt", ws) == hashlib.sha256(b"inside").hexdigest()
    assert resolve("file:out.txt", ws) == "<outside workspace>"
    assert resolve("file:outdir/secret.txt", ws) == "<outside workspace>"
    before = resolve("glob!:**/*.txt", ws)
    assert before.startswith("3 files ")  # real, in, out; ** does not enter outdir
    outside.write_bytes(b"changed outside")
    assert resolve("glob!:**/*.txt", ws) == before
    (ws / "real.txt").write_bytes(b"changed inside")
    assert resolve("glob!:**/*.txt", ws) != before


def test_a_symlink_loop_does_not_hang(ws: Path) -> None:
    (ws / "loop").symlink_to(ws, target_is_directory=True)
    write(ws / "a.txt", b"a")
    assert resolve("glob!:**/*.txt", ws).startswith("1 file ")
    assert resolve("glob!:*/*.txt", ws).startswith("1 file ")  # loop/a.txt, inside


# --- file: ---


def test_file_is_the_content_hash_and_missing_is_a_placeholder(ws: Path) -> None:
    write(ws / "package.json", b'{"a": 1}', mtime_ns=10**9)
    value = resolve("file:package.json", ws)
    assert value == hashlib.sha256(b'{"a": 1}').hexdigest()
    os.utime(ws / "package.json", ns=(2 * 10**9, 2 * 10**9))
    assert resolve("file:package.json", ws) == value
    assert resolve("file:nope.json", ws) == "<missing>"
    (ws / "d").mkdir()
    assert resolve("file:d", ws) == "<not a file>"


def test_an_unreadable_file_is_a_placeholder(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(ws / "a.txt", b"a")
    real_open = os.open

    def refuse(path: str, flags: int, *args: int) -> int:
        if str(path).endswith("a.txt"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(fp.os, "open", refuse)  # tests run as root: chmod 000 would not do
    assert resolve("file:a.txt", ws) == "<unreadable>"
    assert resolve("glob!:*.txt", ws).startswith("1 file ")


# --- env: ---


def test_env_is_hashed_and_unset_is_a_placeholder(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLOWER_TEST_SECRET", raising=False)
    assert resolve("env:FLOWER_TEST_SECRET", ws) == "<unset>"
    monkeypatch.setenv("FLOWER_TEST_SECRET", "")
    empty = resolve("env:FLOWER_TEST_SECRET", ws)
    monkeypatch.setenv("FLOWER_TEST_SECRET", "hunter2-token")
    value = resolve("env:FLOWER_TEST_SECRET", ws)
    assert "hunter2" not in value and value != empty != "<unset>"
    assert resolve("env:FLOWER_TEST_SECRET", ws) == value
    monkeypatch.setenv("FLOWER_TEST_SECRET", "other")
    assert resolve("env:FLOWER_TEST_SECRET", ws) != value


# --- resolve_all and the digest ---


def test_the_digest_is_order_free_and_moves_with_any_value(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWER_TEST_A", "1")
    entries = ["env:FLOWER_TEST_A", "file:x", "env:FLOWER_TEST_A"]
    resolved = resolve_all(entries, ws)
    assert list(resolved) == ["env:FLOWER_TEST_A", "file:x"]
    digest = fingerprint_digest(resolved)
    assert len(digest) == 64
    assert fingerprint_digest(dict(reversed(resolved.items()))) == digest
    monkeypatch.setenv("FLOWER_TEST_A", "2")
    assert fingerprint_digest(resolve_all(entries, ws)) != digest
    assert fingerprint_digest({}) != digest


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    entry=st.one_of(
        st.text(max_size=30),
        st.builds(lambda p, r: p + r, st.sampled_from(PREFIXES), st.text(max_size=30)),
    )
)
def test_resolve_never_raises(ws: Path, entry: str) -> None:
    value = resolve(entry, ws)
    assert isinstance(value, str) and value
    assert (check_entry(entry) is None) or value == "<invalid>"
