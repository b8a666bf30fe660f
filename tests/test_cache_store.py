"""The cross-run cache store (seed 004): 1000 entries, 90 days, atomic owner-only files,
checked keys, and a damaged, full or unwritable store that never breaks a run."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flower.cache import (
    MAX_AGE_S,
    MAX_ENTRIES,
    CacheStore,
    Entry,
    cache_key,
    check_ttl,
    parse_ttl,
)
from flower.cache import store as store_mod

DAY = 86400.0
T0 = 1_700_000_000.0


def entry(key: str, *, created_at: float = T0, ctx_value: object = "the answer") -> Entry:
    return Entry(
        key=key,
        step="analyze",
        input_hash="i" * 64,
        fingerprints={"git:HEAD": "abc"},
        result={"text": "done", "session_id": "s1", "cost_usd": 0.25, "num_turns": 3},
        ctx_value=ctx_value,
        created_at=created_at,
        flow="nightly",
    )


def k(n: int) -> str:
    return cache_key(f"input-{n}", "fp")


@pytest.fixture
def store(tmp_path: Path) -> CacheStore:
    return CacheStore(tmp_path / "run" / "cache", durable=False)


# --- keys ---


def test_the_key_is_64_hex_digits_and_moves_with_either_half() -> None:
    key = CacheStore.key("input", "fp")
    assert len(key) == 64 and int(key, 16) >= 0 and key == key.lower()
    assert key == cache_key("input", "fp")
    assert len({key, cache_key("input", "fp2"), cache_key("input2", "fp")}) == 3
    assert cache_key("a\0b", "c") != cache_key("a", "b\0c")


@pytest.mark.parametrize(
    "bad", ["../x", "../" + "0" * 61, "A" * 64, "0" * 63, "0" * 65, "0" * 62 + "/x", "", 7]
)
def test_a_key_that_is_not_64_hex_digits_is_refused(store: CacheStore, bad: object) -> None:
    with pytest.raises(ValueError, match="not a cache key"):
        store.get(bad, ttl_s=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a cache key"):
        store.put(bad, entry(str(bad)))  # type: ignore[arg-type]
    assert not store.rows.root.exists()


def test_put_refuses_an_entry_filed_under_another_key(store: CacheStore) -> None:
    with pytest.raises(ValueError, match="is not the key"):
        store.put(k(1), entry(k(2)))


# --- put and get ---


def test_put_then_get_gives_the_entry_back(store: CacheStore) -> None:
    e = entry(k(1), ctx_value={"items": [1, "二", None]})
    assert store.put(k(1), e) is True
    assert store.get(k(1), ttl_s=None, now=T0 + 1) == e
    assert store.get(k(2), ttl_s=None, now=T0 + 1) is None
    assert len(store) == 1


def test_files_are_owner_only_and_sharded_by_the_key(tmp_path: Path) -> None:
    s = CacheStore(tmp_path / "run" / "cache")  # durable, as runs use it
    assert s.put(k(1), entry(k(1)))
    path = s.rows.root / k(1)[:2] / f"{k(1)}.json"
    assert s.rows.path(k(1)) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for d in (s.rows.root, path.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp file left
    data = json.loads(path.read_text())
    assert next(iter(data)) == "created_at"  # first: eviction reads only the head
    assert data["result"]["cost_usd"] == 0.25 and data["flow"] == "nightly"


def test_a_second_put_replaces_the_entry(store: CacheStore) -> None:
    store.put(k(1), entry(k(1), ctx_value="old"))
    store.put(k(1), entry(k(1), ctx_value="new", created_at=T0 + 5))
    got = store.get(k(1), ttl_s=None, now=T0 + 6)
    assert got is not None and got.ctx_value == "new"
    assert len(store) == 1


def test_an_empty_or_absent_store_has_no_entries(store: CacheStore) -> None:
    assert len(store) == 0
    assert store.get(k(1), ttl_s=None) is None
    assert not store.rows.root.exists()  # reading creates nothing


# --- ttl and the 90-day limit ---


def test_an_entry_past_its_ttl_is_not_served(store: CacheStore) -> None:
    store.put(k(1), entry(k(1)))
    week = parse_ttl("7d")
    assert store.get(k(1), ttl_s=week, now=T0 + 7 * DAY - 1) is not None
    assert store.get(k(1), ttl_s=week, now=T0 + 7 * DAY + 1) is None
    assert store.get(k(1), ttl_s=None, now=T0 + 7 * DAY + 1) is not None  # no ttl
    assert store.get(k(1), ttl_s=0.0, now=T0 + 0.001) is None


def test_an_entry_older_than_90_days_is_not_served_whatever_the_ttl(store: CacheStore) -> None:
    store.put(k(1), entry(k(1)))
    assert MAX_AGE_S == 90 * DAY
    assert store.get(k(1), ttl_s=None, now=T0 + MAX_AGE_S - 1) is not None
    assert store.get(k(1), ttl_s=None, now=T0 + MAX_AGE_S + 1) is None
    assert store.get(k(1), ttl_s=1000 * DAY, now=T0 + MAX_AGE_S + 1) is None
    assert store.rows.path(k(1)).exists()  # not served is not deleted: eviction's job


def test_an_entry_from_the_future_is_not_served(store: CacheStore) -> None:
    store.put(k(1), entry(k(1), created_at=T0 + 30 * DAY))
    assert store.get(k(1), ttl_s=None, now=T0) is None
    assert store.get(k(1), ttl_s=None, now=T0 + 30 * DAY - 60) is not None  # clock skew


# --- eviction ---


@pytest.mark.timeout(120)  # 1001 puts, each listing the store: about 2 s here, more on a loaded CI
def test_the_1001st_entry_evicts_the_oldest(store: CacheStore) -> None:
    assert MAX_ENTRIES == 1000
    order = list(range(MAX_ENTRIES + 1))
    for n in order[1:] + order[:1]:  # the oldest (n=0) is written last: age, not order, rules
        assert store.put(k(n), entry(k(n), created_at=T0 + n))
    assert len(store) == MAX_ENTRIES
    assert store.get(k(0), ttl_s=None, now=T0 + 2000) is None
    assert not store.rows.path(k(0)).exists()
    assert store.get(k(1), ttl_s=None, now=T0 + 2000) is not None
    assert store.get(k(MAX_ENTRIES), ttl_s=None, now=T0 + 2000) is not None


def test_a_created_at_tie_goes_by_the_file_mtime(store: CacheStore) -> None:
    for n in (1, 2):
        store.put(k(n), entry(k(n)))
    os.utime(store.rows.path(k(1)), (T0 + 100, T0 + 100))
    os.utime(store.rows.path(k(2)), (T0 + 50, T0 + 50))
    assert store.evict(max_entries=1) == 1
    assert store.rows.path(k(1)).exists() and not store.rows.path(k(2)).exists()


def test_eviction_sets_a_damaged_file_aside_instead_of_deleting_it(store: CacheStore) -> None:
    for n in (1, 2, 3):
        store.put(k(n), entry(k(n), created_at=T0 + n))
    store.rows.path(k(3)).write_text("not json")
    store.evict(max_entries=1)
    assert [p.name.split(".json.")[1][:8] for p in store.rows.path(k(3)).parent.glob("*.corrupt-*")]
    assert len(store) == 1 and store.rows.path(k(2)).exists()  # 3 aside, 1 evicted


def test_eviction_reads_an_entry_whose_head_is_not_in_the_usual_order(store: CacheStore) -> None:
    store.put(k(1), entry(k(1), created_at=T0 + 10))
    store.put(k(2), entry(k(2), created_at=T0 + 20))
    data = json.loads(store.rows.path(k(1)).read_text())
    store.rows.path(k(1)).write_text(json.dumps(dict(reversed(data.items()))))
    store.evict(max_entries=1)
    assert not store.rows.path(k(1)).exists() and store.rows.path(k(2)).exists()


# --- a damaged or unwritable store never breaks a run ---


@pytest.mark.parametrize(
    "damage",
    [
        b"{half a file",
        b"\xff\xfe not utf-8",
        b"[1, 2]",
        b'{"version": 1, "key": "x"}',
        b"[" * 100_000,  # deeper than the parser's recursion
    ],
)
def test_a_damaged_entry_is_moved_aside_and_is_a_miss(
    store: CacheStore, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    store.put(k(1), entry(k(1)))
    store.rows.path(k(1)).write_bytes(damage)
    with caplog.at_level(logging.WARNING, logger="flower"):
        assert store.get(k(1), ttl_s=None, now=T0) is None
    aside = list(store.rows.path(k(1)).parent.glob(f"{k(1)}.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == damage  # kept, byte for byte
    assert not store.rows.path(k(1)).exists()
    assert str(aside[0]) in caplog.text
    assert store.put(k(1), entry(k(1)))  # the key works again


def test_an_entry_under_the_wrong_name_is_damaged(store: CacheStore) -> None:
    store.put(k(1), entry(k(1)))
    wrong = store.rows.path(k(2))
    wrong.parent.mkdir(parents=True, exist_ok=True)
    os.replace(store.rows.path(k(1)), wrong)
    assert store.get(k(2), ttl_s=None, now=T0) is None
    assert list(wrong.parent.glob("*.corrupt-*"))


def test_an_entry_of_a_newer_flower_is_a_miss_left_in_place(store: CacheStore) -> None:
    store.put(k(1), entry(k(1)))
    store.rows.path(k(1)).write_text(json.dumps({"version": 2, "key": k(1)}))
    assert store.get(k(1), ttl_s=None, now=T0) is None
    assert store.rows.path(k(1)).exists()


def test_an_unwritable_store_returns_false_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWER_LANG", "en")
    (tmp_path / "run").write_text("a file where the run_dir's cache folder should go")
    s = CacheStore(tmp_path / "run" / "cache")  # tests run as root: chmod would not stop it
    with caplog.at_level(logging.WARNING, logger="flower"):
        assert s.put(k(1), entry(k(1))) is False
        assert s.put(k(2), entry(k(2))) is False
    assert s.get(k(1), ttl_s=None) is None
    assert len(s) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "could not write the cross-run cache" in lines[0]
    assert "the run goes on" in lines[0]


def test_a_full_disk_returns_false(
    store: CacheStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object, **kw: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod, "atomic_write_text", full)
    with caplog.at_level(logging.WARNING, logger="flower"):
        assert store.put(k(1), entry(k(1))) is False
    assert "No space left on device" in caplog.text


def test_a_value_that_is_not_json_is_not_stored(
    store: CacheStore, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="flower"):
        assert store.put(k(1), entry(k(1), ctx_value=object())) is False
    assert "'analyze'" in caplog.text
    assert len(store) == 0


def test_a_failed_eviction_does_not_fail_the_put(
    store: CacheStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: CacheStore, max_entries: int = MAX_ENTRIES) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(CacheStore, "evict", broken)
    assert store.put(k(1), entry(k(1))) is True


# --- ttl ---


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 7 * DAY),
        ("90m", 5400.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("30s", 30.0),
        (".5s", 0.5),
        (" 2d ", 2 * DAY),
        ("0s", 0.0),
        (3600, 3600.0),
        (0.25, 0.25),
        (None, None),
    ],
)
def test_parse_ttl_accepts_a_number_and_a_unit(text: str | float | None, seconds: float) -> None:
    assert parse_ttl(text) == seconds
    assert check_ttl(text) is None


@pytest.mark.parametrize(
    "text", ["", "7w", "d", "-1d", "7", "7D", "7 d", "1e3s", "inf", -5, math.inf, math.nan, True]
)
def test_parse_ttl_refuses_anything_else_in_one_line(text: object) -> None:
    with pytest.raises(ValueError, match="bad ttl") as info:
        parse_ttl(text)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    assert check_ttl(text) == str(info.value)


def test_check_ttl_names_the_value_and_the_units() -> None:
    assert check_ttl("7w") == (
        "bad ttl '7w': expected a number and a unit ms|s|m|h|d, e.g. '7d', '90m', '500ms'"
    )
    assert check_ttl([1]) is not None


@given(st.floats(min_value=0, max_value=1e9), st.sampled_from(["ms", "s", "m", "h", "d"]))
def test_parse_ttl_of_any_written_number_is_that_many_units(value: float, unit: str) -> None:
    text = f"{value:.6f}{unit}"
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY}[unit]
    got = parse_ttl(text)
    assert got is not None and math.isclose(got, float(f"{value:.6f}") * scale)


@given(st.text(max_size=12))
def test_parse_ttl_either_parses_or_raises_value_error(text: str) -> None:
    try:
        got = parse_ttl(text)
    except ValueError:
        assert check_ttl(text) is not None
    else:
        assert got is not None and got >= 0 and math.isfinite(got)
