"""TrimmingSessionStore on real CLI transcripts: turn ages, expiry, trimming, what stays
untouched, originals kept in SQLite; and is_ephemeral's truth table, step by step."""

from __future__ import annotations

import asyncio
import copy
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from flower.state.trim import (
    HEAD_CHARS,
    EphemeralPolicy,
    TrimmingSessionStore,
    TrimPolicy,
    is_ephemeral,
    result_text,
    tool_results,
    turn_ages,
)
from tests.backends import Backend
from tests.transcripts import KEY, OFF_E, OFF_T, fixture


def store_with(tmp_path: Path, entries: list[dict[str, Any]], **kw: Any) -> TrimmingSessionStore:
    store = TrimmingSessionStore(tmp_path / "runs" / "sessions.db", tmp_path / "ws", **kw)
    asyncio.run(store.append(KEY, entries))
    return store


def layer_on(backend: Backend, entries: list[dict[str, Any]], **kw: Any) -> TrimmingSessionStore:
    """The trimming layer over a store of ``backend`` holding ``entries``."""
    store = TrimmingSessionStore(backend.open()[0], backend.tmp_path / "ws", **kw)
    asyncio.run(store.append(KEY, entries))
    return store


def load(store: TrimmingSessionStore, key: dict[str, str] = KEY) -> list[dict[str, Any]] | None:
    return asyncio.run(store.load(key))


def results_by_command(entries: list[dict[str, Any]]) -> dict[str, str | None]:
    """Bash command (or Read path) → the text of its result, as the model would see it."""
    uses = {}
    for e in entries:
        for b in (e.get("message") or {}).get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                uses[b["id"]] = b["input"].get("command") or b["input"].get("file_path")
    return {uses[b["tool_use_id"]]: result_text(b) for e in entries for _, b in tool_results(e)}


def notice(cmd: str, age: int) -> str:
    return f"[{cmd} 的结果已过期(第 {age} 轮前),当前状态可能已变。需要请重新执行]"


# --------------------------------------------------------------------------------------
# turns
# --------------------------------------------------------------------------------------


def ages_by_command(entries: list[dict[str, Any]]) -> dict[str, int]:
    ages = turn_ages(entries)
    by_id = {}
    for e in entries:
        for b in (e.get("message") or {}).get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                by_id[b["id"]] = b["input"].get("command") or b["input"].get("file_path")
    return {
        by_id[b["tool_use_id"]]: ages[n] for n, e in enumerate(entries) for _, b in tool_results(e)
    }


def test_age_counts_model_responses_after_a_result() -> None:
    # d: six responses; the first is two entries (text + tool_use) with one message.id
    ages = ages_by_command(fixture("d-bash-and-read.jsonl"))
    assert ages == {
        "ls": 5,
        "git status": 4,
        "cat notes.txt": 3,
        "seq 1 700": 2,
        "/tmp/flower-fixtures/d/work/notes.txt": 1,
    }


def test_parallel_calls_of_one_response_are_one_turn() -> None:
    ages = ages_by_command(fixture("f-parallel-denials.jsonl"))
    assert ages == {
        "ls": 2,
        "rm -rf build": 2,
        "echo pushing": 2,
        "cat notes.txt": 1,
        "echo again": 1,
    }


def test_synthetic_entries_are_not_turns() -> None:
    # b: the interrupted result, then "No response requested." (<synthetic>), then 1 answer
    entries = fixture("b-killed-mid-tool-resumed.jsonl")
    assert list(ages_by_command(entries).values()) == [1]
    # a: the API error is <synthetic> too: one real answer in the whole transcript
    a = fixture("a-refused-then-resumed.jsonl")
    assert turn_ages(a)[0] == 1


def test_a_subagent_transcript_counts_its_own_sidechain_turns() -> None:
    assert ages_by_command(fixture("h-subagent.sub.jsonl")) == {"ls": 1}


def test_a_subagent_transcript_loads_through_the_layer(backend: Backend) -> None:
    # the SDK loads subagent transcripts under their subpath, after the main one
    sub_key = {**KEY, "subpath": "subagents/agent-aef8473d3a9e65624"}
    store = layer_on(backend, fixture("h-subagent.jsonl"), ephemeral=EphemeralPolicy(keep_recent=1))
    asyncio.run(store.append(sub_key, fixture("h-subagent.sub.jsonl")))
    assert results_by_command(load(store, sub_key) or [])["ls"] == notice("ls", 1)
    assert store.last_report == {"expired": 1, "trimmed": 0}


# --------------------------------------------------------------------------------------
# expiry
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keep_recent", "expired"),
    [
        (6, []),
        (5, ["ls"]),
        (3, ["ls", "git status", "cat notes.txt"]),
        (0, ["ls", "git status", "cat notes.txt"]),
    ],
)
def test_one_off_bash_results_expire_past_keep_recent_turns(
    tmp_path: Path, keep_recent: int, expired: list[str]
) -> None:
    raw = fixture("d-bash-and-read.jsonl")
    store = store_with(
        tmp_path, raw, policy=OFF_T, ephemeral=EphemeralPolicy(keep_recent=keep_recent)
    )
    before, after = results_by_command(raw), results_by_command(load(store))
    ages = ages_by_command(raw)
    for cmd, text in after.items():
        if cmd in expired:
            assert text == notice(cmd, ages[cmd])
        else:  # seq is not a one-off command, Read is not Bash
            assert text == before[cmd]
    assert store.last_report == {"expired": len(expired)}
    assert not (tmp_path / "ws" / ".flower").exists()  # expired text is dropped, not spilled


def test_only_results_up_to_max_chars_count_as_glances(tmp_path: Path) -> None:
    raw = fixture("d-bash-and-read.jsonl")
    before = results_by_command(raw)
    limit = len(before["ls"])  # "notes.txt"; git status printed far more
    pol = EphemeralPolicy(keep_recent=0, max_chars=limit)
    after = results_by_command(load(store_with(tmp_path, raw, policy=OFF_T, ephemeral=pol)))
    assert after["ls"] == notice("ls", 5)
    assert after["git status"] == before["git status"]
    assert len(before["git status"]) > limit


def test_expiry_text_is_the_policys(tmp_path: Path) -> None:
    pol = EphemeralPolicy(keep_recent=4, text="<{cmd}|{age}>")
    after = results_by_command(
        load(store_with(tmp_path, fixture("d-bash-and-read.jsonl"), policy=OFF_T, ephemeral=pol))
    )
    assert after["ls"] == "<ls|5>" and after["git status"] == "<git status|4>"


def test_refused_results_are_not_expired(tmp_path: Path) -> None:
    # c: `echo pushing` is a one-off command, but its result is a hook's refusal
    raw = fixture("c-denied-tools.jsonl")
    store = store_with(tmp_path, raw, policy=OFF_T, ephemeral=EphemeralPolicy(keep_recent=0))
    assert results_by_command(load(store)) == results_by_command(raw)
    assert store.last_report == {"expired": 0}


def test_parallel_results_expire_and_keep_their_blocks(tmp_path: Path) -> None:
    raw = fixture("f-parallel-denials.jsonl")
    store = store_with(tmp_path, raw, policy=OFF_T, ephemeral=EphemeralPolicy(keep_recent=1))
    after = results_by_command(load(store))
    assert after["ls"] == notice("ls", 2) and after["cat notes.txt"] == notice("cat notes.txt", 1)
    assert after["rm -rf build"] == results_by_command(raw)["rm -rf build"]


# --------------------------------------------------------------------------------------
# trimming
# --------------------------------------------------------------------------------------

SEQ = "seq 1 700"


def test_large_old_result_is_spilled_to_a_private_file(tmp_path: Path) -> None:
    raw = fixture("d-bash-and-read.jsonl")
    original = results_by_command(raw)[SEQ]
    assert original is not None and len(original) > 2000
    store = store_with(tmp_path, raw, policy=TrimPolicy(keep_recent=2), ephemeral=OFF_E)
    pointer = results_by_command(load(store))[SEQ]
    spill_dir = tmp_path / "ws" / ".flower" / "spill"
    files = list(spill_dir.iterdir())
    assert len(files) == 1 and files[0].read_text(encoding="utf-8") == original
    assert str(files[0]) in pointer and pointer.endswith("\n" + original[:HEAD_CHARS])
    assert len(pointer) < 600
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(spill_dir.stat().st_mode) == 0o700
    assert store.last_report == {"trimmed": 1}
    # written once: a second load finds the file and leaves it alone
    before = files[0].stat()
    assert results_by_command(load(store))[SEQ] == pointer
    assert files[0].stat().st_mtime_ns == before.st_mtime_ns
    assert files[0].stat().st_ino == before.st_ino


@pytest.mark.parametrize(
    "policy",
    [
        TrimPolicy(keep_recent=3),
        TrimPolicy(keep_recent=0, min_chars=2691),
        TrimPolicy(enabled=False),
    ],
    ids=["too-recent", "not-longer-than-min_chars", "disabled"],
)
def test_results_that_do_not_qualify_stay(tmp_path: Path, policy: TrimPolicy) -> None:
    raw = fixture("d-bash-and-read.jsonl")
    assert len(results_by_command(raw)[SEQ] or "") == 2691
    after = load(store_with(tmp_path, raw, policy=policy, ephemeral=OFF_E))
    assert after == raw
    assert not (tmp_path / "ws" / ".flower").exists()


def test_a_result_that_cannot_be_spilled_is_kept_whole(tmp_path: Path) -> None:
    raw = fixture("d-bash-and-read.jsonl")
    (tmp_path / "ws").write_text("a file where the workspace should be")
    store = store_with(tmp_path, raw, policy=TrimPolicy(keep_recent=0), ephemeral=OFF_E)
    assert load(store) == raw
    assert store.last_report == {"trimmed": 0, "trim_failed": 1}


@pytest.mark.parametrize("name", ["e-read-png.jsonl", "j-read-pdf.jsonl", "i-compacted.jsonl"])
def test_images_documents_and_compact_summaries_are_never_touched(
    tmp_path: Path, name: str
) -> None:
    raw = fixture(name)
    harsh = {
        "policy": TrimPolicy(keep_recent=0, min_chars=0),
        "ephemeral": EphemeralPolicy(keep_recent=0),
    }
    after = load(store_with(tmp_path, raw, **harsh))
    assert after is not None and len(after) == len(raw)
    kept = [
        (a, b)
        for a, b in zip(raw, after, strict=False)
        if a.get("isCompactSummary")
        or any(result_text(blk) is None for _, blk in tool_results(a))  # image / document
    ]
    assert kept, "the fixture has no such entry"
    for a, b in kept:
        assert a == b


def test_the_pdf_result_is_left_whole_text_block_included(tmp_path: Path) -> None:
    raw = fixture("j-read-pdf.jsonl")
    [block] = [b for e in raw for _, b in tool_results(e)]
    assert [c["type"] for c in block["content"]] == ["text", "document"]
    after = load(store_with(tmp_path, raw, policy=TrimPolicy(keep_recent=0, min_chars=0)))
    assert after == raw


def test_tool_result_blocks_always_stay(tmp_path: Path) -> None:
    raw = fixture("d-bash-and-read.jsonl")
    after = load(
        store_with(
            tmp_path,
            raw,
            policy=TrimPolicy(keep_recent=0, min_chars=0),
            ephemeral=EphemeralPolicy(keep_recent=0),
        )
    )
    ids = [[b["tool_use_id"] for _, b in tool_results(e)] for e in raw]
    assert [[b["tool_use_id"] for _, b in tool_results(e)] for e in after] == ids
    assert len(after) == len(raw)


# --------------------------------------------------------------------------------------
# the store around the rules
# --------------------------------------------------------------------------------------


def test_defaults_and_public_attributes(tmp_path: Path) -> None:
    store = TrimmingSessionStore(tmp_path / "s.db", tmp_path / "ws")
    assert store.policy == TrimPolicy(keep_recent=20, min_chars=2000, spill_dirname=".flower/spill")
    assert store.ephemeral == EphemeralPolicy(enabled=True, keep_recent=6, max_chars=2000)
    assert store.workspace == tmp_path / "ws" and store.last_report == {}
    assert load(store) is None and store.last_report == {}


def test_the_store_below_keeps_every_original_byte(backend: Backend) -> None:
    raw = fixture("d-bash-and-read.jsonl")
    store = layer_on(
        backend, raw, policy=TrimPolicy(keep_recent=0), ephemeral=EphemeralPolicy(keep_recent=0)
    )
    rows_before = backend.stored()
    after = load(store)
    assert after != raw
    assert store.load_sync(KEY) == raw
    assert backend.stored() == rows_before
    assert [json.loads(d) for d in rows_before] == raw


def test_load_returns_new_dicts_and_mutates_nothing(tmp_path: Path) -> None:
    raw = fixture("f-parallel-denials.jsonl")
    store = TrimmingSessionStore(
        tmp_path / "s.db",
        tmp_path / "ws",
        TrimPolicy(keep_recent=0, min_chars=5),
        EphemeralPolicy(keep_recent=0),
    )
    snapshot = copy.deepcopy(raw)
    out = store.reshape(raw)
    assert raw == snapshot
    changed = [n for n, (a, b) in enumerate(zip(raw, out, strict=False)) if a != b]
    assert changed and all(out[n] is not raw[n] for n in changed)
    assert all(out[n]["message"] is not raw[n]["message"] for n in changed)


def test_load_works_from_a_running_event_loop(tmp_path: Path) -> None:
    raw = fixture("d-bash-and-read.jsonl")
    store = store_with(tmp_path, raw, ephemeral=EphemeralPolicy(keep_recent=5))

    async def main() -> list[dict[str, Any]] | None:
        return await asyncio.wait_for(store.load(KEY), 10)

    assert results_by_command(asyncio.run(main()) or [])["ls"] == notice("ls", 5)


# --------------------------------------------------------------------------------------
# is_ephemeral
# --------------------------------------------------------------------------------------

TRUTH = [
    # 1. empty
    ("", False),
    ("   \t\n", False),
    # 2. substitution
    ("ls $(pwd)", False),
    ("echo `id`", False),
    ('cat "$(ls)"', False),
    ("diff <(ls a) <(ls b)", False),
    ("ls >(cat)", False),
    # 2. state-changing forms, even with whitelisted verbs around them
    ("ls | xargs rm", False),
    ("exec ls", False),
    ("eval ls", False),
    ("source env.sh", False),
    ("ls | tee listing.txt", False),
    ("find . -name '*.pyc' -delete", False),
    ("find . -ok rm {} ;", False),
    ("find . -fprint out.txt", False),
    ("find . -exec rm {} +", False),
    ("sed -i 's/a/b/' f", False),
    ("sed -ni p f", False),
    ("sed --in-place=.bak 's/a/b/' f", False),
    ("sort -o out.txt f", False),
    ("sort --output=out.txt f", False),
    ("""awk '{system("rm x")}' f""", False),
    ("""awk '{print > "out"}' f""", False),
    ("""awk '{print $1 | "sh"}' f""", False),
    ("git branch -D old", False),
    ("git branch -d old", False),
    ("git branch -m old new", False),
    ("git push --force", False),
    ("git push --force-with-lease", False),
    ("git reset --hard HEAD~1", False),
    ("git fetch --prune", False),
    ("git status --prune", False),
    # 3. redirections: safe ones removed, anything else left → False
    ("ls 2>&1", True),
    ("ls &> /dev/null", True),
    ("ls >/dev/null", True),
    ("ls 2>/dev/null", True),
    ("ls >&2", True),
    ("ls > out.txt", False),
    ("ls >> out.txt", False),
    ("ls >/dev/null.txt", False),
    ("wc -l < f", False),
    ("cat <<< hello", False),
    ("grep '->' f", True),  # quoted: not a redirection
    # 4. background jobs
    ("ls &", False),
    ("sleep 1 & ls", False),
    ("ls |& cat", False),
    ("ls && pwd", True),
    ("ls || pwd", True),
    ("grep '&' f", True),
    # 5. every segment whitelisted
    ("git status && git log --oneline -5", True),
    ("git status; git diff --stat", True),
    ("ls | wc -l", True),
    ("ps aux | grep python | head -5", True),
    ("git status\nls", True),
    ("git status; rm -rf x", False),
    ("cat f | sh", False),
    ("ls;", True),
    ("rm -rf build", False),
    ("python3 -c 'print(1)'", False),
    ("cd sub && ls", False),
    ("FOO=1 ls", False),
    ("ls 'unterminated", False),
    ("grep -E 'a|b' f", True),  # quoted pipe is not a separator
    # the seed's groups
    ("git diff HEAD~1", True),
    ("git show HEAD", True),
    ("git branch", True),
    ("git branch -a -v", True),
    ("git branch --list 'feat/*'", True),
    ("git rev-parse HEAD", True),
    ("git -C /repo status", True),
    ("git --no-pager log -3", True),
    ("ls -la", True),
    ("pwd", True),
    ("df -h", True),
    ("du -sh .", True),
    ("date", True),
    ("date +%s", True),
    ("whoami", True),
    ("env", True),
    ("ps aux", True),
    ("top -b -n 1", True),
    ("lsof -i :8080", True),
    ("docker ps -a", True),
    ("kubectl get pods", True),
    ("kubectl -n prod get pods", True),
    ("cat notes.txt", True),
    ("head -20 f", True),
    ("tail -n 5 f", True),
    ("wc -l f", True),
    ("stat f", True),
    ("find . -name '*.py'", True),
    ("tree -L 2", True),
    ("which git", True),
    ("whereis git", True),
    ("command -v git", True),
    ("type ls", True),
    ("grep -rn TODO .", True),
    ("rg TODO", True),
    ("sort f", True),
    ("sort f | uniq -c", True),
    ("awk '{print $1}' f", True),
    ("sed -n '1,20p' f", True),
    ("sed 's|a|b|g' f", True),
    ("jq .name package.json", True),
    ("diff a b", True),
    # whitelisted verbs whose arguments can still write or run something
    ("git branch new-branch", False),
    ("git tag v1.0", False),
    ("git tag -l", True),
    ("git stash", False),
    ("git stash list", True),
    ("git remote add origin x", False),
    ("git remote -v", True),
    ("git config user.name x", False),
    ("git config --get user.name", True),
    ("git -c core.pager=sh log", False),
    ("git diff --output=patch.txt", False),
    ("git commit -m x", False),
    ("docker rm x", False),
    ("kubectl delete pod x", False),
    ("env rm -rf x", False),
    ("command rm x", False),
    ("date -s '2020-01-01'", False),
    ("uniq in.txt out.txt", False),
    ("tree -o out.txt", False),
    ("rg --pre cat TODO", False),
    ("sed -n 's/a/b/w out' f", False),
    ("sed 's/a/b/e' f", False),
    ("sed -f script.sed f", False),
    ("awk -f prog.awk f", False),
    ("hostname newname", False),
]


@pytest.mark.parametrize(("cmd", "expected"), TRUTH, ids=[repr(c) for c, _ in TRUTH])
def test_is_ephemeral(cmd: str, expected: bool) -> None:
    assert is_ephemeral(cmd) is expected
