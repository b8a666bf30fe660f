"""Moving a workspace's local run state into PostgreSQL (``flower-super state export``).

:func:`export_state` copies what a run_dir holds for one workspace into a database, through
the same row stores the runs use (:class:`~flower.state.backends.SharedState`):

- sessions: every key of ``sessions.db`` (main transcripts and their subpaths), every
  entry in order, with its uuid; the workspace's own ones under its identity (keys of other
  workspaces keep their project key);
- the tool ledger's rows, as they are;
- the lineage (its wake count and steps) when it is this workspace's and woken more often
  than the database's copy (a tie, or fewer, and the database's stands);
- the manifest rows, the registry records (the run history) and the event logs of this
  workspace's runs (and of runs no record names);
- the cross-run cache's entries and its ``last.json``.

The workspace's identity is written first (``<workspace>/.flower/workspace-id``), keeping
the key its path gives it (:func:`flower.state.identity.workspace_id` with ``keep``), so the
copied sessions are found where the runs look for them; a workspace that has an identity
already keeps it, and its sessions are copied under it.

It reads the local files only (sessions.db read-only; nothing is set aside, nothing
rewritten) and copies only what the database does not hold yet: running it twice
changes nothing the second time; what ran locally since is copied the next time. What the
database already holds of its own (a lineage a run there has woken further, a session a
run there continued) is kept, never overwritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ConfigError, FlowerError
from ..i18n import define, t
from .errors import Superseded
from .records import LedgerRow, LineageDoc

define(
    {
        "export.no_dir": ("{path} 没有运行目录", "no run directory at {path}"),
        "export.no_dir.hint": (
            "在启动 flower 的目录里运行,或用 -r DIR 指定",
            "run it where you started flower, or pass -r DIR",
        ),
        "export.no_workspace": ("工作区 {path} 不是目录", "workspace {path} is not a directory"),
        "export.no_workspace.hint": (
            "在工作区里运行,或用 -w DIR 指定",
            "run it in the workspace, or pass -w DIR",
        ),
        "export.busy": (
            "flower pid {pid}(run {run})正在 {run_dir} 里跑,这时导出会漏掉它还在写的东西",
            "flower pid {pid} (run {run}) is running in {run_dir}; an export now would miss "
            "what it is still writing",
        ),
        "export.busy.hint": (
            "等它跑完,或者先 flower-super cancel {run}",
            "wait for it to finish, or flower-super cancel {run} first",
        ),
        "export.unreadable": (
            "{path} 读不了:{why}",
            "{path} cannot be read: {why}",
        ),
        "export.unreadable.hint": (
            "flower-super status 会说明它怎么了",
            "flower-super status says what is wrong with it",
        ),
        "export.sessions": (
            "会话      {keys} 个(含子代理的),复制了 {copied} 条记录,{same} 条已在",
            "sessions   {keys} {keys|key|keys} (subagents' included): copied {copied} "
            "{copied|entry|entries}, {same} there already",
        ),
        "export.sessions.owned": (
            "          {n} 个会话在数据库里已被接着跑过,它们多出的本地记录没有复制",
            "           {n} {n|session|sessions} went on in the database since: {n|its|their} "
            "extra local entries were not copied",
        ),
        "export.ledger": (
            "工具账本  复制了 {copied} 行,{same} 行已在",
            "ledger     copied {copied} {copied|row|rows}, {same} there already",
        ),
        "export.lineage.copied": (
            "血缘      复制了:第 {woke} 次唤醒,{steps} 个步骤",
            "lineage    copied: woke {woke}, {steps} {steps|step|steps}",
        ),
        "export.lineage.same": (
            "血缘      已在:第 {woke} 次唤醒,{steps} 个步骤",
            "lineage    there already: woke {woke}, {steps} {steps|step|steps}",
        ),
        "export.lineage.kept": (
            "血缘      数据库里这个工作区的血缘已唤醒到第 {woke} 次,保留它,没有覆盖",
            "lineage    the database's own is further on (woke {woke}); kept it, not overwritten",
        ),
        "export.lineage.none": ("血缘      没有", "lineage    none"),
        "export.lineage.foreign": (
            "血缘      lineage.json 是工作区 {workspace} 的,不是这个的;没有复制",
            "lineage    lineage.json belongs to workspace {workspace}, not this one; not copied",
        ),
        "export.manifest": (
            "清单      复制了 {copied} 行,{same} 行已在",
            "manifest   copied {copied} {copied|row|rows}, {same} there already",
        ),
        "export.registry": (
            "运行记录  复制了 {copied} 条,{same} 条已在",
            "runs       copied {copied} {copied|record|records}, {same} there already",
        ),
        "export.foreign": (
            "          另有 {n} 次运行是别的工作区的,没有复制",
            "           {n} other {n|run belongs|runs belong} to other workspaces: not copied",
        ),
        "export.cache": (
            "跨运行缓存 复制了 {copied} 条,{same} 条已在",
            "cache      copied {copied} {copied|entry|entries}, {same} there already",
        ),
        "export.events": (
            "事件日志  {runs} 次运行,复制了 {copied} 条事件,{same} 条已在",
            "events     {runs} {runs|run|runs}: copied {copied} {copied|event|events}, "
            "{same} there already",
        ),
        "export.skipped": (
            "          跳过了 {n} 条读不了的",
            "           skipped {n} that cannot be read",
        ),
        "export.done": (
            "已导出到 {where}。工作区的身份 {ident} 在 {file};之后在这个工作区用 --state 或 "
            "FLOWER_STATE 运行,就接着同一段对话。本地文件原样未动。",
            "exported to {where}. The workspace's identity {ident} is in {file}; from now on "
            "run with --state or FLOWER_STATE in this workspace and it carries on the same "
            "conversations. The local files are as they were.",
        ),
    }
)

__all__ = ["Exported", "export_state"]

# Every transcript's key (the store's clock row has no session)
_KEYS = (
    "SELECT key, project_key, session_id, subpath FROM meta"
    " WHERE project_key IS NOT NULL AND session_id IS NOT NULL ORDER BY key"
)
_ENTRIES = "SELECT data FROM entries WHERE key = ? ORDER BY seq"
_LEDGER = (
    "SELECT tool_use_id, session_id, agent_id, name, input, state, started_at, message,"
    " response, content, is_error, ended_at FROM tool_calls ORDER BY started_at, tool_use_id"
)
BATCH = 500  # entries per append: one statement each, well below any size limit


@dataclass
class Exported:
    """What :func:`export_state` did: one count per thing, for a person and for tests."""

    where: str
    workspace_id: str
    identity_file: Path
    lines: list[str] = field(default_factory=list)
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # what -> (copied, there)

    def copied(self) -> int:
        """How much was copied in all (0: the database had everything already)."""
        return sum(c for c, _ in self.counts.values())

    def summary(self) -> str:
        file = self.identity_file
        return t("export.done", where=self.where, ident=self.workspace_id, file=file)


def export_state(
    run_dir: Path, workspace: Path, url: str, *, say: Callable[[str], Any] = lambda _: None
) -> Exported:
    """Copy ``run_dir``'s run state of ``workspace`` into the database at ``url`` (see the
    module docstring); ``say`` gets one line per thing copied, as it is done.

    Raises FlowerError, one line with a hint: a run_dir or workspace that is not there, a
    flower running in the run_dir, a file that cannot be read, a URL that is not
    PostgreSQL's, a refused password, a database that is missing or down."""
    from .backends import SharedState
    from .identity import IDENTITY_FILE, path_key, workspace_id
    from .registry import Registry

    run_dir, workspace = Path(run_dir), Path(workspace)
    if not run_dir.is_dir():
        raise FlowerError(t("export.no_dir", path=run_dir), hint=t("export.no_dir.hint"))
    if not workspace.is_dir():
        raise ConfigError(
            t("export.no_workspace", path=workspace), hint=t("export.no_workspace.hint")
        )
    live = Registry(run_dir).live()
    if live:
        raise FlowerError(
            t("export.busy", pid=live[0].pid, run=live[0].run, run_dir=run_dir),
            hint=t("export.busy.hint", run=live[0].run),
        )
    shared = SharedState(url, run_dir=run_dir, workspace=workspace, create=False)
    try:
        # Written only once the database took us: a refused export leaves nothing behind.
        ident = workspace_id(workspace, create=True, keep=path_key(workspace))
        done = Exported(shared.where, ident, workspace / IDENTITY_FILE)
        _Copy(shared, run_dir, workspace, ident, done, say).all()
    finally:
        shared.close()
    return done


class _Copy:
    """One export: each ``_thing`` method copies one kind of state and says how it went."""

    def __init__(
        self,
        shared: Any,
        run_dir: Path,
        workspace: Path,
        ident: str,
        done: Exported,
        say: Callable[[str], Any],
    ) -> None:
        self.shared, self.run_dir, self.workspace, self.ident = shared, run_dir, workspace, ident
        self.rows = shared.rows  # the database's row stores
        self.done, self.say = done, say
        self.db = run_dir / "sessions.db"
        self.foreign = self._foreign_runs()

    def all(self) -> None:
        asyncio.run(self._sessions_and_ledger())
        self._lineage()
        self._manifest()
        self._registry()
        self._cache()
        self._events()

    def _line(self, what: str, copied: int, same: int, key: str, **extra: Any) -> None:
        self.done.counts[what] = (copied, same)
        self._say(t(key, copied=copied, same=same, **extra))

    def _say(self, line: str) -> None:
        self.done.lines.append(line)
        self.say(line)

    # -- sessions and the tool ledger ---------------------------------------------------

    async def _sessions_and_ledger(self) -> None:
        store = self.shared.sessions  # seen through the workspace's identity
        keys = copied = same = owned = 0
        with self._local_db() as conn:
            for key_string, project_key, session_id, subpath in _rows(conn, _KEYS):
                key = {"project_key": project_key, "session_id": session_id}
                if subpath is not None:
                    key["subpath"] = subpath
                local = [json.loads(d) for (d,) in _rows(conn, _ENTRIES, (key_string,))]
                there = store.load_sync(key) or []
                todo = _missing(local, there)
                keys += 1
                same += len(local) - len(todo)
                try:
                    for i in range(0, len(todo), BATCH):
                        await store.append(key, todo[i : i + BATCH])
                        copied += len(todo[i : i + BATCH])
                except Superseded:
                    owned += 1  # a run in the database owns it now: its entries win
            self._line("sessions", copied, same, "export.sessions", keys=keys)
            if owned:
                self._say(t("export.sessions.owned", n=owned))
            await self._ledger(conn)

    async def _ledger(self, conn: sqlite3.Connection | None) -> None:
        ledger = self.shared.ledger
        local = [_ledger_row(row) for row in _rows(conn, _LEDGER)]
        there = {r.tool_use_id: r for r in ledger.by_ids([r.tool_use_id for r in local])}
        copied = same = 0
        for row in local:
            if there.get(row.tool_use_id) == row:
                same += 1
                continue
            try:
                await ledger.started(row)
                if row.state != "started":
                    await ledger.finished(row)
            except Superseded:
                continue  # its session went on in the database: the database's row stands
            copied += 1
        self._line("ledger", copied, same, "export.ledger")

    @contextlib.contextmanager
    def _local_db(self) -> Iterator[sqlite3.Connection | None]:
        """sessions.db, read-only (None when there is none). A database closed cleanly has
        no write-ahead log left: it is read as immutable, which makes no ``-shm``/``-wal``
        file beside it (``mode=ro`` does, and cannot remove them). One whose writer was
        killed keeps its log, which holds the last entries: read through it then."""
        if not self.db.exists():
            yield None
            return
        wal = Path(f"{self.db}-wal")
        how = "mode=ro" if wal.exists() and wal.stat().st_size > 0 else "immutable=1"
        try:
            conn = sqlite3.connect(f"{self.db.as_uri()}?{how}", uri=True, timeout=10)
        except sqlite3.Error as exc:
            raise self._unreadable(self.db, exc) from None
        try:
            yield conn
        except sqlite3.Error as exc:
            raise self._unreadable(self.db, exc) from None
        finally:
            conn.close()

    @staticmethod
    def _unreadable(path: Path, why: BaseException) -> FlowerError:
        text = getattr(why, "strerror", None) or why
        return FlowerError(
            t("export.unreadable", path=path, why=text), hint=t("export.unreadable.hint")
        )

    # -- lineage, manifest, registry ------------------------------------------------------

    def _lineage(self) -> None:
        from .lineage import peek, same_workspace

        doc = peek(self.run_dir)
        if not doc:
            self.done.counts["lineage"] = (0, 0)
            self._say(t("export.lineage.none"))
            return
        if not same_workspace(str(doc["workspace"]), str(self.workspace)):
            self.done.counts["lineage"] = (0, 0)
            self._say(t("export.lineage.foreign", workspace=doc["workspace"]))
            return
        mine = LineageDoc(str(self.workspace), int(doc["woke"]), dict(doc["steps"]))
        # The one woken more often is the newer: local runs since the last export, or runs
        # in the database since (kept, never overwritten). A tie is the database's.
        with self.rows.lineage.update(self.ident) as box:
            there = box[0]
            newer = there is None or mine.woke > there.woke
            if newer:
                box[0] = mine
        if newer:
            key, counts = "export.lineage.copied", (1, 0)
        elif (there.woke, there.steps) == (mine.woke, mine.steps):
            key, counts, mine = "export.lineage.same", (0, 1), there
        else:
            key, counts, mine = "export.lineage.kept", (0, 1), there
        self.done.counts["lineage"] = counts
        self._say(t(key, woke=mine.woke, steps=len(mine.steps)))

    def _manifest(self) -> None:
        from .manifest import read_manifest

        local = [row for row in read_manifest(self.run_dir) if row.get("run") not in self.foreign]
        there = Counter(_canonical(row) for row in self.rows.manifest.rows(self.ident))
        copied = same = 0
        for row in local:
            text = _canonical(row)
            if there[text] > 0:
                there[text] -= 1
                same += 1
                continue
            self.rows.manifest.append(self.ident, row)
            copied += 1
        self._line("manifest", copied, same, "export.manifest")

    def _registry(self) -> None:
        from .registry import Registry

        copied = same = 0
        for record in Registry(self.run_dir).records():
            if record.run in self.foreign:
                continue
            if self.rows.registry.get(record.run) is not None:
                same += 1  # a run id is one run: the database's record of it stands
                continue
            data = json.loads(record.to_json())
            data["workspace_id"] = self.ident
            self.rows.registry.write(data)
            copied += 1
        self._line("registry", copied, same, "export.registry")
        if self.foreign:
            self._say(t("export.foreign", n=len(self.foreign)))

    def _foreign_runs(self) -> set[str]:
        """Runs whose record names another workspace: theirs, not this one's to move."""
        from .lineage import same_workspace
        from .registry import Registry

        mine = str(self.workspace)
        return {
            r.run
            for r in Registry(self.run_dir).records()
            if r.workspace and not same_workspace(r.workspace, mine)
        }

    # -- the cache and the event logs -----------------------------------------------------

    def _cache(self) -> None:
        from ..cache import CacheStore, Entry, check_key

        root = self.run_dir / "cache"
        copied = same = skipped = 0
        for path in sorted(root.glob("??/*.json")):
            try:
                key = check_key(path.stem)
                data = json.loads(path.read_bytes())
                if Entry.from_dict(data).key != key:
                    raise ValueError(key)
            except (OSError, ValueError, RecursionError):
                skipped += 1  # damaged: a run sets it aside; nothing to move
                continue
            there = self.rows.cache.get(key)
            if there is not None and float(there.get("created_at") or 0) >= data["created_at"]:
                same += 1
                continue
            self.rows.cache.put(key, data)
            copied += 1
        last = CacheStore(root).read_last()
        if last and not self.shared.cache.read_last():
            self.shared.cache.write_last(last)
            copied += 1
        elif last:
            same += 1
        self._line("cache", copied, same, "export.cache")
        if skipped:
            self._say(t("export.skipped", n=skipped))

    def _events(self) -> None:
        from .eventlog import events_path

        runs = copied = same = skipped = 0
        logs = self.run_dir / "logs"
        for run in sorted(p.name for p in logs.iterdir()) if logs.is_dir() else []:
            path = events_path(self.run_dir, run)
            if run in self.foreign or not path.is_file():
                continue
            try:
                local, bad = _events_of(path)
            except OSError as exc:
                raise self._unreadable(path, exc) from None
            runs += 1
            skipped += bad
            there = [ev for _, ev in self.rows.events.read(run)]
            todo = _missing(local, there)
            same += len(local) - len(todo)
            for ev in todo:
                self.rows.events.append(run, ev)
            copied += len(todo)
        self._line("events", copied, same, "export.events", runs=runs)
        if skipped:
            self._say(t("export.skipped", n=skipped))


def _rows(conn: sqlite3.Connection | None, sql: str, params: Any = ()) -> list[Any]:
    """``sql``'s rows, none when there is no database or no such table (an older file)."""
    if conn is None:
        return []
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise


def _ledger_row(row: Any) -> LedgerRow:
    (tid, sid, agent, name, input_, state, started, message, response, content, err, ended) = row
    return LedgerRow(
        tid, sid, agent, name, input_, state, float(started), message, response, content,
        bool(err), ended,
    )  # fmt: skip


def _missing(local: list[Any], there: list[Any]) -> list[Any]:
    """What of ``local`` (entries or events, in order) the database lacks: all of it when it
    has none; what follows when it holds a beginning of it; nothing when it holds all of it
    (and maybe more: a run there went on). Diverged copies keep the database's, adding only
    the entries whose uuid it does not hold (the append skips the others)."""
    if local[: len(there)] == there:
        return local[len(there) :]
    if there[: len(local)] == local:
        return []
    held = {e.get("uuid") for e in there if isinstance(e, dict)}
    return [e for e in local if isinstance(e, dict) and e.get("uuid") and e["uuid"] not in held]


def _canonical(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, ensure_ascii=False)


def _events_of(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The events of one ``events.jsonl`` in order, and how many lines could not be read (a
    supervisor killed mid-line leaves at most one)."""
    events: list[dict[str, Any]] = []
    bad = 0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(ev, dict):
            events.append(ev)
        else:
            bad += 1
    return events, bad
