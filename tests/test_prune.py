"""PruningSessionStore on real CLI transcripts: API errors dropped, denials kept to the
latest N (both halves of each call), interruptions neutralised, parentUuid relinked; the
order against trimming; SQLite untouched; a property test over generated transcripts; the
Runtime's store; and the real CLI resuming through the SDK with this store."""

from __future__ import annotations

import asyncio
import copy
import json
import random
import socket
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from claude_agent_sdk.testing import run_session_store_conformance
from claude_agent_sdk.types import SessionStore
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flower.state.backends import LocalState
from flower.state.postgres import PostgresSessionStore
from flower.state.prune import (
    INTERRUPTED_TEXT,
    PrunePolicy,
    PruningSessionStore,
    is_api_error,
    is_denied,
    is_interrupted,
)
from flower.state.seam import Sessions, Superseded
from flower.state.sqlite import SqliteLedgerRows, SqliteSessionStore
from flower.state.stores import layered, open_store
from flower.state.trim import (
    EphemeralPolicy,
    TrimPolicy,
    result_text,
    tool_results,
    tool_uses,
)
from tests.backends import Backend
from tests.transcripts import KEY, OFF_E, OFF_T, fixture


def pruned(
    backend: Backend, entries: list[dict[str, Any]], **kw: Any
) -> tuple[list[dict[str, Any]], PruningSessionStore]:
    """``entries`` appended to a pruning store of ``backend`` and loaded back."""
    kw.setdefault("policy", OFF_T)
    kw.setdefault("ephemeral", OFF_E)
    store = backend.pruning(**kw)
    asyncio.run(store.append(KEY, entries))
    out = asyncio.run(store.load(KEY))
    assert out is not None
    return out, store


def by_uuid(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["uuid"]: e for e in entries if e.get("uuid")}


def find(entries: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    [hit] = [e for e in entries if e.get("uuid", "").startswith(prefix)]
    return hit


def commands(entries: list[dict[str, Any]]) -> list[str]:
    return [b["input"].get("command", b["name"]) for e in entries for _, b in tool_uses(e)]


def result_ids(entries: list[dict[str, Any]]) -> list[str]:
    return [b["tool_use_id"] for e in entries for _, b in tool_results(e)]


def use_ids(entries: list[dict[str, Any]]) -> list[str]:
    return [b["id"] for e in entries for _, b in tool_uses(e)]


def assert_chain_sound(entries: list[dict[str, Any]]) -> None:
    """Every reference names a present entry; every tool_use has its result and back."""
    present = set(by_uuid(entries))
    for e in entries:
        for k in ("parentUuid", "logicalParentUuid", "leafUuid"):
            assert e.get(k) is None or e[k] in present, (k, e.get(k))
    assert sorted(use_ids(entries)) == sorted(result_ids(entries))


# --------------------------------------------------------------------------------------
# API errors
# --------------------------------------------------------------------------------------


def test_synthetic_api_error_is_dropped_and_its_child_relinked(backend: Backend) -> None:
    raw = fixture("a-refused-then-resumed.jsonl")
    err = next(e for e in raw if e.get("isApiErrorMessage"))
    assert err["message"]["model"] == "<synthetic>" and is_api_error(err)
    out, store = pruned(backend, raw)
    assert not any(is_api_error(e) for e in out) and len(out) == len(raw) - 1
    # the resumed prompt hung off the error; now off the error's parent
    prompt = find(out, "396568ba")
    assert prompt["parentUuid"] == err["parentUuid"] == find(raw, "bae632f5")["uuid"]
    # the first run's last-prompt named the error as the leaf
    leaves = [e["leafUuid"] for e in out if e.get("type") == "last-prompt"]
    assert err["uuid"] not in leaves and err["parentUuid"] in leaves
    assert store.last_report == {"api_errors": 1, "interrupted": 0, "denials": 0, "relinked": 2}
    assert_chain_sound(out)
    assert any(is_api_error(e) for e in store.load_sync(KEY) or [])


# --------------------------------------------------------------------------------------
# denials
# --------------------------------------------------------------------------------------

C_DENIED = ["python3 -c \"print('needs approval')\"", "rm -rf build", "echo pushing"]


@pytest.mark.parametrize("keep", [0, 1, 2, 3, 5])
def test_only_the_latest_denials_are_kept(backend: Backend, keep: int) -> None:
    raw = fixture("c-denied-tools.jsonl")
    assert [c for c in commands(raw) if c in C_DENIED] == C_DENIED
    out, store = pruned(backend, raw, prune=PrunePolicy(keep_denials=keep))
    kept = C_DENIED[max(0, len(C_DENIED) - keep) :]
    assert [c for c in commands(out) if c in C_DENIED] == kept
    # the call to a disabled tool was refused too, but is not a permission denial
    assert "Write" in commands(out)
    assert sum(is_denied(e, b) for e in out for _, b in tool_results(e)) == len(kept)
    assert store.last_report["denials"] == len(C_DENIED) - len(kept)
    assert_chain_sound(out)


def test_a_dropped_call_relinks_through_both_of_its_entries(backend: Backend) -> None:
    raw = fixture("c-denied-tools.jsonl")
    out, _ = pruned(backend, raw, prune=PrunePolicy(keep_denials=1))
    # prompt_snapshot 5de0306c hung off the first denied result 51b1c605, whose parent is
    # its tool_use 535211e0: both are gone, so it now hangs off cbbd6a63 (two levels up)
    assert find(raw, "5de0306c")["parentUuid"].startswith("51b1c605")
    assert find(raw, "51b1c605")["parentUuid"].startswith("535211e0")
    assert find(out, "5de0306c")["parentUuid"] == find(raw, "cbbd6a63")["uuid"]
    # the Write call hung off the second denied result (0c3f… tool_use edf78e13 …)
    assert find(out, "c5ec0af5")["parentUuid"] == find(raw, "66b481d6")["uuid"]


def test_parallel_denials_in_a_tree(backend: Backend) -> None:
    raw = fixture("f-parallel-denials.jsonl")
    out, store = pruned(backend, raw, prune=PrunePolicy(keep_denials=1))
    assert commands(out) == ["ls", "cat notes.txt", "echo again"]
    # text → tu(ls) → tu(rm) → tu(echo pushing) → result(echo pushing) → snapshot: three
    # consecutive removed entries between the snapshot and its nearest survivor
    assert find(out, "2a132847")["parentUuid"] == find(raw, "ce1d8678")["uuid"]
    assert find(out, "1eac377b")["parentUuid"] == find(raw, "ce1d8678")["uuid"]  # ls result
    assert store.last_report["denials"] == 2
    assert_chain_sound(out)


def test_a_removed_entry_with_several_children(backend: Backend) -> None:
    raw = fixture("f-parallel-denials.jsonl")
    rm_use = find(raw, "87ccfaa0")
    children = [e for e in raw if e.get("parentUuid") == rm_use["uuid"]]
    assert {c["uuid"][:8] for c in children} == {"737c4d2a", "a9e443fe"}
    out, _ = pruned(backend, raw, prune=PrunePolicy(keep_denials=2))  # drops rm only
    assert commands(out) == ["ls", "echo pushing", "cat notes.txt", "echo again"]
    assert find(out, "737c4d2a")["parentUuid"] == rm_use["parentUuid"]
    assert "a9e443fe" not in {u[:8] for u in by_uuid(out)}
    assert_chain_sound(out)


def test_several_blocks_in_one_entry_keep_their_pairs(backend: Backend) -> None:
    # The brief's case of an assistant entry holding several blocks (2.1.332 writes one
    # entry per block): f with each response's blocks merged into its first entry.
    # Dropping a call must remove that block only and keep the rest of the entry.
    raw = _merged_per_message(fixture("f-parallel-denials.jsonl"))
    first = next(e for e in raw if e.get("type") == "assistant")
    assert [b["type"] for b in first["message"]["content"]] == ["text", *["tool_use"] * 3]
    out, _ = pruned(backend, raw, prune=PrunePolicy(keep_denials=0))
    assert commands(out) == ["ls", "cat notes.txt"]
    first = next(e for e in out if e.get("type") == "assistant")
    assert [b["type"] for b in first["message"]["content"]] == ["text", "tool_use"]
    assert_chain_sound(out)


def _merged_per_message(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    heads: dict[str, dict[str, Any]] = {}
    head_of: dict[str, str] = {}
    for e in copy.deepcopy(entries):
        msg_id = (e.get("message") or {}).get("id") if e.get("type") == "assistant" else None
        if msg_id in heads:
            heads[msg_id]["message"]["content"] += e["message"]["content"]
            head_of[e["uuid"]] = heads[msg_id]["uuid"]
            continue
        if msg_id:
            heads[msg_id] = e
        out.append(e)
    for e in out:  # what pointed at a merged entry points at the entry it went into
        for key in ("parentUuid", "sourceToolAssistantUUID", "leafUuid"):
            e[key] = head_of.get(e.get(key), e.get(key)) if key in e else None
        for key in [k for k in ("sourceToolAssistantUUID", "leafUuid") if e.get(k) is None]:
            e.pop(key, None)
    return out


# --------------------------------------------------------------------------------------
# interruptions
# --------------------------------------------------------------------------------------


def test_the_clis_interrupted_filler_is_neutralised(backend: Backend) -> None:
    raw = fixture("b-killed-mid-tool-resumed.jsonl")
    before = find(raw, "18f45fd5")
    [(_, block)] = list(tool_results(before))
    assert block["content"].startswith("[Tool call interrupted") and is_interrupted(before, block)
    out, store = pruned(backend, raw, prune=PrunePolicy(keep_denials=0))
    after = find(out, "18f45fd5")
    [(_, new)] = list(tool_results(after))
    assert new == {**block, "content": INTERRUPTED_TEXT}  # is_error and the id kept
    assert len(out) == len(raw) and find(out, "8d18ec87")  # "No response requested." kept
    assert store.last_report == {"api_errors": 0, "interrupted": 1, "denials": 0, "relinked": 0}


def test_flowers_own_interrupt_is_not_taken_for_a_denial(backend: Backend) -> None:
    # client.interrupt() mid-tool writes toolDenialKind "user-rejected", like a refusal
    raw = fixture("g-sdk-interrupt-resumed.jsonl")
    entry = find(raw, "52297153")
    [(_, block)] = list(tool_results(entry))
    assert entry["toolDenialKind"] == "user-rejected" and "permissionDecision" not in entry
    assert is_interrupted(entry, block) and not is_denied(entry, block)
    out, store = pruned(backend, raw, prune=PrunePolicy(keep_denials=0))
    assert result_text(next(tool_results(find(out, "52297153")))[1]) == INTERRUPTED_TEXT
    texts = [e["message"]["content"] for e in out if e.get("type") == "user"]
    assert [{"type": "text", "text": "[Request interrupted by user for tool use]"}] in texts
    assert store.last_report["interrupted"] == 1 and store.last_report["denials"] == 0
    assert_chain_sound(out)


# Shapes the CLI 2.1.332 writes that no recording here produced; the fields are as its
# source writes them (an abort before the call ran; a result cut off by a shutdown).
@pytest.mark.parametrize(
    ("marks", "text", "interrupted", "denied"),
    [
        (
            {"toolDenialKind": "cancelled"},
            "The user doesn't want to take this action right now.",
            True,
            False,
        ),
        (
            {"toolDenialKind": "user-rejected", "interruptedByShutdown": True},
            "The user doesn't want",
            True,
            False,
        ),
        (
            {"toolDenialKind": "user-rejected"},
            "The user doesn't want to proceed with this tool use.",
            False,
            True,
        ),
        ({"permissionDecision": {"decision": "reject"}}, "refused", False, True),
        ({"permissionDecision": {"decision": "accept"}}, "fine", False, False),
        ({}, "<tool_use_error>Error: No such tool available: Write</tool_use_error>", False, False),
    ],
)
def test_classifying_results(
    marks: dict[str, Any], text: str, interrupted: bool, denied: bool
) -> None:
    entry = {"type": "user", **marks}
    block = {"type": "tool_result", "tool_use_id": "t", "content": text, "is_error": True}
    assert (is_interrupted(entry, block), is_denied(entry, block)) == (interrupted, denied)


def test_no_response_requested_is_not_an_api_error() -> None:
    entry = find(fixture("b-killed-mid-tool-resumed.jsonl"), "8d18ec87")
    assert entry["message"]["model"] == "<synthetic>" and not is_api_error(entry)


def test_interrupted_text_is_the_policys(backend: Backend) -> None:
    out, _ = pruned(
        backend,
        fixture("b-killed-mid-tool-resumed.jsonl"),
        prune=PrunePolicy(interrupted_text="[gone]"),
    )
    assert result_text(next(tool_results(find(out, "18f45fd5")))[1]) == "[gone]"


# --------------------------------------------------------------------------------------
# pruning before trimming, the whole layer, originals
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("keep", "age"), [(0, 1), (1, 2), (2, 3)])
def test_turns_are_counted_after_pruning(backend: Backend, keep: int, age: int) -> None:
    # k: `ls`, then two responses that were only a refused call each, then an answer.
    # The trimming layer runs on what pruning left: dropped responses are not turns.
    raw = fixture("k-glance-then-denials.jsonl")
    pol = EphemeralPolicy(keep_recent=2)
    out, store = pruned(backend, raw, prune=PrunePolicy(keep_denials=keep), ephemeral=pol)
    ls = next(b for e in out for _, b in tool_results(e) if b["tool_use_id"] == use_ids(raw)[0])
    expired = age >= pol.keep_recent
    assert result_text(ls) == (
        f"[ls 的结果已过期(第 {age} 轮前),当前状态可能已变。需要请重新执行]"
        if expired
        else "notes.txt"
    )
    # one entry moves: the answer (keep 0) or the kept refused call (keep 1)
    relinked = 1 if keep < 2 else 0
    assert store.last_report == {
        "api_errors": 0,
        "denials": 2 - keep,
        "interrupted": 0,
        "relinked": relinked,
        "expired": int(expired),
    }
    assert_chain_sound(out)


def test_interrupted_results_are_neutralised_not_spilled(backend: Backend) -> None:
    harsh = {
        "policy": TrimPolicy(keep_recent=0, min_chars=0),
        "ephemeral": EphemeralPolicy(keep_recent=0),
    }
    out, store = pruned(backend, fixture("g-sdk-interrupt-resumed.jsonl"), **harsh)
    assert result_text(next(tool_results(find(out, "52297153")))[1]) == INTERRUPTED_TEXT
    assert list(store.last_report) == [
        "api_errors",
        "denials",
        "interrupted",
        "relinked",
        "expired",
        "trimmed",
    ]
    assert not (backend.tmp_path / "ws" / ".flower").exists()


def test_disabled_pruning_changes_nothing(backend: Backend) -> None:
    raw = fixture("c-denied-tools.jsonl") + fixture("a-refused-then-resumed.jsonl")
    out, store = pruned(backend, raw, prune=PrunePolicy(enabled=False))
    assert out == raw and store.last_report == {}


def test_the_store_below_keeps_every_original_byte(backend: Backend) -> None:
    raw = fixture("f-parallel-denials.jsonl")
    sessions, rows = backend.open()
    store = PruningSessionStore(
        sessions,
        backend.tmp_path / "ws",
        TrimPolicy(keep_recent=0, min_chars=5),
        EphemeralPolicy(keep_recent=0),
        PrunePolicy(keep_denials=0),
        ledger=rows,
    )
    asyncio.run(store.append(KEY, raw))
    stored = backend.stored()
    snapshot = copy.deepcopy(raw)
    out = asyncio.run(store.load(KEY))
    assert out != raw and raw == snapshot
    assert store.load_sync(KEY) == raw
    assert backend.stored() == stored and [json.loads(r) for r in stored] == raw


@pytest.mark.timeout(120)  # on PostgreSQL fifteen stores, each creating its schema
def test_passes_the_sdks_conformance_suite(backend: Backend) -> None:
    for name in ("list_sessions", "list_session_summaries", "delete", "list_subkeys"):
        # the suite silently skips a method the class does not override
        assert getattr(PruningSessionStore, name) is not getattr(SessionStore, name), name
    made: list[PruningSessionStore] = []

    def make_store() -> PruningSessionStore:  # each contract gets an empty store
        made.append(backend.pruning(f"c{len(made)}"))
        return made[-1]

    asyncio.run(run_session_store_conformance(make_store))
    assert len(made) == 15  # a probe plus one store per contract: nothing was skipped
    assert isinstance(made[0], Sessions)
    inner = SqliteSessionStore if backend.kind == "sqlite" else PostgresSessionStore
    assert all(type(store.inner) is inner for store in made)


@pytest.mark.parametrize(
    ("trim", "ephemeral", "trim_on", "ephemeral_on"),
    [(False, True, False, True), (True, False, True, False), (False, False, False, False)],
)
def test_the_runtimes_store(
    tmp_path: Path, trim: Any, ephemeral: Any, trim_on: bool, ephemeral_on: bool
) -> None:
    rt = SimpleNamespace(
        run_dir=tmp_path / "runs",
        workspace=tmp_path,
        state=LocalState(tmp_path / "runs", tmp_path),
        trim=trim,
        ephemeral=ephemeral,
        keep_denials=3,
    )
    store = open_store(rt)
    assert isinstance(store, PruningSessionStore) and isinstance(store.inner, SqliteSessionStore)
    assert store.inner.path == tmp_path / "runs" / "sessions.db" and store.workspace == tmp_path
    assert (
        isinstance(store.ledger.rows, SqliteLedgerRows) and store.ledger.rows.store is store.inner
    )
    assert (store.policy.enabled, store.ephemeral.enabled) == (trim_on, ephemeral_on)
    assert store.prune_policy == PrunePolicy(keep_denials=3)  # pruning always on
    mine = TrimPolicy(keep_recent=3)
    assert open_store(SimpleNamespace(**{**vars(rt), "trim": mine})).policy is mine


def test_layered_puts_the_layers_over_a_run_states_sessions_and_ledger(backend: Backend) -> None:
    sessions, rows = backend.open()
    ws = backend.tmp_path / "ws"
    store = layered(sessions, rows, workspace=ws, trim=True, ephemeral=False, keep_denials=2)
    assert store.inner is sessions and store.workspace == ws
    assert store.ledger.rows is rows and store.ledger.store is sessions
    assert (store.policy, store.ephemeral) == (TrimPolicy(), EphemeralPolicy(enabled=False))
    assert store.prune_policy == PrunePolicy(keep_denials=2)
    mine = EphemeralPolicy(keep_recent=2)
    assert layered(sessions, rows, workspace=ws, ephemeral=mine).ephemeral is mine
    raw = fixture("c-denied-tools.jsonl")
    asyncio.run(store.append(KEY, raw))  # written below, read back whole by the store itself
    assert sessions.load_sync(KEY) == raw and store.has_session(None, KEY["session_id"])
    assert asyncio.run(store.list_sessions(KEY["project_key"])) == asyncio.run(
        sessions.list_sessions(KEY["project_key"])
    )
    out = asyncio.run(store.load(KEY)) or []
    assert [c for c in commands(out) if c in C_DENIED] == C_DENIED[-2:]


def test_the_layers_carry_the_backends_fencing(backend: Backend) -> None:
    """Two attempts of one step by hand, each through its own layers: on PostgreSQL the
    superseded one's appends are refused; locally one writer per session is the
    supervisor's business and nothing is ever refused."""
    first, second = backend.pruning(), backend.pruning()
    e = [{"type": "user", "uuid": f"u{n}", "message": {"content": str(n)}} for n in range(3)]
    epoch = first.begin_attempt()
    assert epoch > 0 and first.inner.epoch == epoch  # type: ignore[attr-defined]  # the inner's
    first.claim(KEY["session_id"])
    asyncio.run(first.append(KEY, [e[0]]))
    second.begin_attempt()
    second.claim(KEY["session_id"])  # the next attempt resumes the session
    if backend.kind == "postgres":
        with pytest.raises(Superseded):
            asyncio.run(first.append(KEY, [e[1]]))
        with pytest.raises(Superseded):
            first.claim(KEY["session_id"])
    else:
        asyncio.run(first.append(KEY, [e[1]]))
        first.claim(KEY["session_id"])
    asyncio.run(second.append(KEY, [e[2]]))
    kept = [e[0], e[2]] if backend.kind == "postgres" else e
    assert second.load_sync(KEY) == kept and asyncio.run(second.load(KEY)) == kept


# --------------------------------------------------------------------------------------
# property: generated transcripts
# --------------------------------------------------------------------------------------

OUTCOMES = ["ok", "ok", "denied", "hook", "stopped", "cancelled", "filler", "missing-tool"]


class Gen:
    """Builds transcripts the way the CLI writes them (see the fixtures' README)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.tip: str | None = None
        self.n = 0
        self.dangling: set[str] = set()

    def add(self, entry: dict[str, Any], *, parent: Any = "tip", advance: bool = True) -> str:
        self.n += 1
        uid = f"u{self.n}"
        entry.update(uuid=uid, parentUuid=self.tip if parent == "tip" else parent, seq=self.n)
        entry.setdefault("isSidechain", False)
        self.entries.append(entry)
        if advance:
            self.tip = uid
        return uid

    def assistant(self, blocks: list[dict[str, Any]], msg_id: str, **kw: Any) -> dict[str, Any]:
        model = kw.pop("model", "claude-test")
        return {
            "type": "assistant",
            "message": {"id": msg_id, "model": model, "role": "assistant", "content": blocks},
            **kw,
        }

    def batch(
        self, outcomes: list[str], order: list[int], legacy: bool, side: bool, size: int
    ) -> None:
        msg_id = f"msg{self.n}"
        ids = [f"toolu{self.n}_{i}" for i in range(len(outcomes))]
        uses = [
            {"type": "tool_use", "id": t, "name": "Bash", "input": {"command": c}}
            for t, c in zip(ids, _cmds(len(ids)), strict=False)
        ]
        base = self.tip
        if legacy:  # one entry holding every block, one entry holding every result
            same = outcomes[0]
            owner = self.add(
                self.assistant([{"type": "text", "text": "t"}, *uses], msg_id, isSidechain=side)
            )
            blocks = [_result(t, same, size) for t in ids]
            self.add(
                {
                    "type": "user",
                    "message": {"role": "user", "content": blocks},
                    **_marks(same),
                    "sourceToolAssistantUUID": owner,
                    "isSidechain": side,
                }
            )
            self._after(same)
            return
        owners = [self.add(self.assistant([u], msg_id, isSidechain=side)) for u in uses]
        for i in order:
            self.add(
                {
                    "type": "user",
                    "message": {"role": "user", "content": [_result(ids[i], outcomes[i], size)]},
                    **_marks(outcomes[i]),
                    "sourceToolAssistantUUID": owners[i],
                    "isSidechain": side,
                },
                parent=owners[i],
            )
        self._after(outcomes[order[-1]])
        del base

    def _after(self, outcome: str) -> None:
        if outcome == "stopped":
            self.add(
                {
                    "type": "user",
                    "message": {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "[Request interrupted by user for tool use]"}
                        ],
                    },
                }
            )
        if outcome == "filler":
            self.add(
                self.assistant(
                    [{"type": "text", "text": "No response requested."}],
                    f"syn{self.n}",
                    model="<synthetic>",
                    isApiErrorMessage=False,
                )
            )


def _cmds(k: int) -> list[str]:
    return [["ls", "git status", "rm -rf b", "cat f"][i % 4] for i in range(k)]


def _result(tool_id: str, outcome: str, size: int) -> dict[str, Any]:
    text = {
        "ok": "x" * size,
        "denied": "This command requires approval",
        "hook": "PreToolUse:Bash hook error: guard: no",
        "stopped": "The user doesn't want to proceed … Correction to the text above: this call"
        " was stopped while running, not refused before it ran.",
        "cancelled": "The user doesn't want to take this action right now.",
        "filler": "[Tool call interrupted: the session ended before this call's result"
        " was recorded …]",
        "missing-tool": "<tool_use_error>Error: No such tool available: X</tool_use_error>",
    }[outcome]
    return {
        "type": "tool_result",
        "tool_use_id": tool_id,
        "content": text,
        "is_error": outcome != "ok",
    }


def _marks(outcome: str) -> dict[str, Any]:
    return {
        "denied": {
            "toolDenialKind": "user-rejected",
            "permissionDecision": {"decision": "reject", "source": "config"},
        },
        "hook": {
            "toolDenialKind": "permission-rule",
            "permissionDecision": {"decision": "reject", "source": "hook"},
        },
        "stopped": {"toolDenialKind": "user-rejected", "toolUseResult": "User rejected tool use"},
        "cancelled": {"toolDenialKind": "cancelled"},
        "filler": {"toolDenialKind": "interrupted"},
    }.get(outcome, {})


batch_st = st.tuples(
    st.just("batch"),
    st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=4),
    st.randoms(use_true_random=False),
    st.booleans(),  # legacy: one entry per message
    st.integers(0, 60),
)
event_st = st.one_of(
    st.sampled_from(
        [("prompt",), ("text",), ("api_error",), ("attachment",), ("last_prompt",), ("compact",)]
    ),
    batch_st,
    st.tuples(
        st.just("sidechain"),
        st.lists(st.sampled_from(OUTCOMES[:4]), min_size=1, max_size=2),
        st.integers(0, 60),
    ),
)


def build(events: list[tuple[Any, ...]], dangling: bool) -> Gen:
    g = Gen()
    g.add({"type": "user", "message": {"role": "user", "content": "go"}})
    for ev in events:
        kind = ev[0]
        if kind == "prompt":
            g.add({"type": "user", "message": {"role": "user", "content": "more"}})
        elif kind == "text":
            g.add(g.assistant([{"type": "text", "text": "ok"}], f"msg{g.n}"))
        elif kind == "api_error":
            g.add(
                g.assistant(
                    [{"type": "text", "text": "API Error: Connection refused"}],
                    f"e{g.n}",
                    model="<synthetic>",
                    isApiErrorMessage=True,
                )
            )
        elif kind == "attachment":
            g.add({"type": "attachment", "attachment": {"type": "date"}})
        elif kind == "last_prompt":
            g.entries.append({"type": "last-prompt", "leafUuid": g.tip, "seq": g.n + 0.5})
        elif kind == "compact":  # the preserved tail: the last two entries of the chain
            before = g.tip
            head = (
                next((e["parentUuid"] for e in g.entries if e.get("uuid") == before), None)
                or before
            )
            meta = {
                "preservedMessages": {"uuids": [head, before]},
                "preservedSegment": {"headUuid": head, "tailUuid": before},
            }
            g.add(
                {
                    "type": "system",
                    "subtype": "compact_boundary",
                    "logicalParentUuid": before,
                    "compactMetadata": meta,
                },
                parent=None,
            )
            g.add(
                {
                    "type": "user",
                    "isCompactSummary": True,
                    "message": {"role": "user", "content": "summary " * 40},
                }
            )
        elif kind == "batch":
            _, outcomes, rnd, legacy, size = ev
            order = list(range(len(outcomes)))
            rnd.shuffle(order)
            g.batch(outcomes, order, legacy, side=False, size=size)
        else:  # an old-style subagent run inside the main transcript, off the main chain
            _, outcomes, size = ev
            main_tip = g.tip
            g.add(
                {
                    "type": "user",
                    "isSidechain": True,
                    "message": {"role": "user", "content": "sub"},
                },
                parent=None,
            )
            g.batch(outcomes, list(range(len(outcomes))), False, side=True, size=size)
            g.tip = main_tip
    if dangling:  # killed mid-tool, not resumed yet: a tool_use with no result
        use = {
            "type": "tool_use",
            "id": "toolu_dangling",
            "name": "Bash",
            "input": {"command": "ls"},
        }
        g.add(g.assistant([use], "msg_dangling"))
        g.dangling.add("toolu_dangling")
    return g


@settings(max_examples=150, deadline=None)
@example(  # a compaction whose preserved tail is an API error
    events=[("text",), ("api_error",), ("compact",), ("prompt",)],
    dangling=False,
    keep=1,
    trim_keep=0,
    min_chars=0,
)
@example(  # ... is a refused call, both halves
    events=[("batch", ["denied"], random.Random(0), False, 5), ("compact",), ("text",)],
    dangling=False,
    keep=0,
    trim_keep=1,
    min_chars=0,
)
@example(  # ... half of which survives
    events=[("text",), ("batch", ["ok", "hook"], random.Random(1), False, 5), ("compact",)],
    dangling=True,
    keep=0,
    trim_keep=0,
    min_chars=3,
)
@given(
    events=st.lists(event_st, max_size=14),
    dangling=st.booleans(),
    keep=st.integers(0, 3),
    trim_keep=st.integers(0, 3),
    min_chars=st.integers(0, 40),
)
def test_generated_transcripts_stay_sound(
    events: list[tuple[Any, ...]], dangling: bool, keep: int, trim_keep: int, min_chars: int
) -> None:
    g = build(events, dangling)
    raw = g.entries
    snapshot = copy.deepcopy(raw)
    with tempfile.TemporaryDirectory() as tmp:
        store = PruningSessionStore(
            Path(tmp) / "s.db",
            Path(tmp) / "ws",
            TrimPolicy(keep_recent=trim_keep, min_chars=min_chars),
            EphemeralPolicy(keep_recent=trim_keep),
            PrunePolicy(keep_denials=keep),
        )
        out = store.reshape(raw)
        store.close()
    assert raw == snapshot  # nothing mutated
    seqs = [e["seq"] for e in out]
    assert seqs == sorted(seqs)  # order preserved
    present = set(by_uuid(out))
    parents = {e["uuid"]: e.get("parentUuid") for e in raw if e.get("uuid")}
    for e in out:
        for k in ("parentUuid", "logicalParentUuid", "leafUuid"):
            assert e.get(k) is None or e[k] in present, (k, e)
        if e.get("uuid") and e.get("parentUuid") is not None:  # relinked only upwards
            assert e["parentUuid"] in _ancestors(parents, parents[e["uuid"]])
        meta = e.get("compactMetadata") or {}
        for u in meta.get("preservedMessages", {}).get("uuids", []):
            assert u in present
        if "preservedSegment" in meta:  # a walk from the tail up reaches the head
            seg = meta["preservedSegment"]
            new_parents = {x["uuid"]: x.get("parentUuid") for x in out if x.get("uuid")}
            assert seg["headUuid"] in _ancestors(new_parents, seg["tailUuid"])
    uses, results = use_ids(out), result_ids(out)
    assert set(uses) - set(results) == g.dangling  # every call answered, as before
    assert set(results) <= set(uses) and len(results) == len(set(results))
    assert not any(is_api_error(e) for e in out)
    raw_denied = [b["tool_use_id"] for e in raw for _, b in tool_results(e) if is_denied(e, b)]
    assert [t for t in results if t in raw_denied] == raw_denied[
        len(raw_denied) - min(keep, len(raw_denied)) :
    ]
    stopped = {b["tool_use_id"] for e in raw for _, b in tool_results(e) if is_interrupted(e, b)}
    assert stopped <= set(results)  # interrupted results stay, only their text changes
    for e in out:
        for _, b in tool_results(e):
            if b["tool_use_id"] in stopped:
                assert result_text(b) == INTERRUPTED_TEXT


def _ancestors(parents: dict[str, Any], uuid: Any) -> set[Any]:
    seen: set[Any] = set()
    while uuid is not None and uuid not in seen:
        seen.add(uuid)
        uuid = parents.get(uuid)
    return seen


# --------------------------------------------------------------------------------------
# end to end: the real CLI resumes through the SDK from this store
# --------------------------------------------------------------------------------------


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: connection refused


def _bash(command: str) -> dict[str, Any]:
    return {"name": "Bash", "input": {"command": command, "description": "e2e"}}


E2E_SCRIPT = {
    "conversations": [
        {
            "name": "pe",
            "match": {"marker": "[[prune-e2e]]"},
            "turns": [
                {"tool_use": _bash("rm -rf build")},
                {"tool_use": _bash("rm -rf dist")},
                {"tool_use": _bash("ls")},
                "Listed.",
                "Carried on.",
            ],
        },
        {
            "name": "fx",
            "match": {"marker": "[[fx-resume]]"},
            "turns": [f"resumed {i}" for i in range(12)],
        },
    ]
}


async def _run(prompt: str, **options: Any) -> Any:
    """One SDK query; the ResultMessage (an error result too)."""
    from claude_agent_sdk import ClaudeAgentOptions, ResultError, ResultMessage, query

    result = None
    try:
        async for msg in query(prompt=prompt, options=ClaudeAgentOptions(**options)):
            if isinstance(msg, ResultMessage):
                result = msg
    except ResultError:
        pass  # the error result was yielded first; this SDK raises after it
    assert result is not None
    return result


def _options(tmp_path: Path, store: PruningSessionStore, url: str, **kw: Any) -> dict[str, Any]:
    from claude_agent_sdk import HookMatcher

    from flower.services.cli_env import claude_path, cli_env

    async def no_rm(data: Any, tool_use_id: Any, context: Any) -> dict[str, Any]:
        if str(data.get("tool_input", {}).get("command", "")).startswith("rm "):
            out = {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": "guard: rm is not allowed here",
            }
            return {"hookSpecificOutput": out}
        return {}

    return {
        "session_store": store,
        "cwd": str(tmp_path / "work"),
        "env": cli_env(tmp_path / "home", url, max_retries=0),
        "cli_path": str(claude_path()),
        "tools": ["Bash", "Read", "Write"],
        "allowed_tools": ["Bash"],
        "system_prompt": "You are a scripted test agent.",
        "hooks": {"PreToolUse": [HookMatcher(matcher="Bash", hooks=[no_rm])]},
        **kw,
    }


@pytest.mark.e2e
@pytest.mark.timeout(180)  # three real CLI runs through the SDK, each a few seconds
def test_resume_after_connection_refused_sends_no_api_error(tmp_path: Path) -> None:
    """Note: CLI 2.1.332 itself skips ``isApiErrorMessage`` rows when it builds a request,
    so "no API Error text" holds with or without this layer; the denial and the expiry
    below are what only the layer does, and a resumed request the model server accepts
    proves the pruned transcript still pairs every tool_use with its result."""
    from claude_agent_sdk import project_key_for_directory

    from flower.services.model_server import ModelServer

    (tmp_path / "work").mkdir()
    store = PruningSessionStore(
        tmp_path / "runs" / "sessions.db",
        tmp_path / "work",
        ephemeral=EphemeralPolicy(keep_recent=1),
    )
    with ModelServer(E2E_SCRIPT, log_path=tmp_path / "requests.jsonl") as server:
        first = asyncio.run(_run("[[prune-e2e]] Start.", **_options(tmp_path, store, server.url)))
        assert not first.is_error and first.result == "Listed.", first
        sid = first.session_id
        refused = asyncio.run(
            _run(
                "[[prune-e2e]] Go on.", resume=sid, **_options(tmp_path, store, _closed_port_url())
            )
        )
        assert refused.is_error and "Connection refused" in (refused.result or ""), refused
        seen = len(server.requests)
        last = asyncio.run(
            _run("[[prune-e2e]] Carry on.", resume=sid, **_options(tmp_path, store, server.url))
        )
        assert not last.is_error and last.result == "Carried on.", last
        [resumed] = [r for r in server.requests[seen:] if r.path == "/v1/messages"]
    key = {"project_key": project_key_for_directory(tmp_path / "work"), "session_id": sid}
    stored = store.load_sync(key) or []
    assert [e["message"]["content"][0]["text"] for e in stored if is_api_error(e)] == [
        refused.result
    ]
    texts = resumed.texts()
    assert resumed.answer == "text" and resumed.status == 200  # not rejected as unpaired
    assert not any("API Error" in t for t in texts)
    assert "Listed." in texts and "[[prune-e2e]] Start." in " ".join(texts)
    assert not any("rm -rf build" in t for t in texts)  # the older denial: both halves gone
    assert any("rm -rf dist" in t for t in texts)  # the latest one kept
    assert "[ls 的结果已过期(第 1 轮前),当前状态可能已变。需要请重新执行]" in texts
    # SQLite kept it all: both refused calls, whole, and the ls output
    assert [c for c in commands(stored) if c.startswith("rm")] == ["rm -rf build", "rm -rf dist"]
    assert sum(is_denied(e, b) for e in stored for _, b in tool_results(e)) == 2
    assert store.last_report == {
        "api_errors": 1,
        "interrupted": 0,
        "denials": 1,
        "relinked": 2,
        "expired": 1,
        "trimmed": 0,
    }


@pytest.mark.e2e
@pytest.mark.timeout(120)  # two real CLI runs through the SDK
@pytest.mark.parametrize("name", ["f-parallel-denials.jsonl", "g-sdk-interrupt-resumed.jsonl"])
def test_recorded_transcripts_resume_after_pruning(tmp_path: Path, name: str) -> None:
    from claude_agent_sdk import project_key_for_directory

    from flower.services.model_server import ModelServer

    raw = fixture(name)
    sid = next(e["sessionId"] for e in raw if e.get("sessionId"))
    (tmp_path / "work").mkdir()
    store = PruningSessionStore(
        tmp_path / "runs" / "sessions.db", tmp_path / "work", prune=PrunePolicy(keep_denials=0)
    )
    key = {"project_key": project_key_for_directory(tmp_path / "work"), "session_id": sid}
    asyncio.run(store.append(key, raw))
    with ModelServer(E2E_SCRIPT, log_path=tmp_path / "requests.jsonl") as server:
        res = asyncio.run(
            _run("[[fx-resume]] go", resume=sid, **_options(tmp_path, store, server.url))
        )
        [req] = [r for r in server.requests if r.path == "/v1/messages"]
    assert not res.is_error and res.result.startswith("resumed"), res
    assert req.answer == "text", req.detail  # every tool_use still has its result
    texts = " ".join(req.texts())
    assert "Correction to the text above" not in texts and "[Tool call interrupted" not in texts
    assert "hook error" not in texts and "needs approval" not in texts
    if name.startswith("g"):
        assert INTERRUPTED_TEXT in req.texts()
    else:
        assert "ls" in texts and "cat notes.txt" in texts
