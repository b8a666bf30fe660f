"""The run's own rows that an outage must not lose: lineage entries, manifest rows, registry
records (written and removed), events.

The supervisor writes them while its steps run: an event for every tool call and every text,
its registry record at each step and heartbeat, a manifest row at the end of every attempt.
A step goes on while the database is down (its child keeps the transcript in its spool), so
these writes go through the same path as the fenced ones (:meth:`.db.Database.write`): to the
database, or, during an outage, into the process's spool, delivered in order once the
database is back (by the process itself, or by the next process that connects when it died
first). They carry no epoch: a run's rows are its own, no attempt supersedes them.

Each is an entry of :data:`OPS` named in the spool, with JSON-able arguments, and takes the
same ``(conn, sql, epoch, args, live)`` as :data:`.fenced.OPS`: ``live`` is not None when
the write is made as it happens, None when a spool delivers it later.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psycopg.types.json import Json

from .fenced import Op

if TYPE_CHECKING:
    from .fenced import Conn
    from .schema import Sql

__all__ = ["LIVE", "NOW", "OPS", "workspace_lock"]

NOW = "extract(epoch FROM clock_timestamp())::double precision"
LIVE = True  # the ``live`` argument of a write made as it happens (see the module docstring)

_MANIFEST = "INSERT INTO {s}.manifest (workspace_id, row) VALUES (%(workspace_id)s, %(row)s::json)"

# A record's heartbeat is the database's clock when written as it happens (a lease judged
# from any machine needs one clock); a record delivered late from a spool keeps the writer's
# clock at the time it was kept, so a flower that died during an outage is not seen alive
# from the moment its spool is delivered.
_REGISTRY = (
    "INSERT INTO {s}.registry (run, workspace_id, started_at, host, heartbeat_at, record)"
    " VALUES (%(run)s, %(workspace_id)s, %(started_at)s, %(host)s, {heartbeat},"
    " %(record)s::json) ON CONFLICT (run) DO UPDATE SET"
    " workspace_id = EXCLUDED.workspace_id, started_at = EXCLUDED.started_at,"
    " host = EXCLUDED.host, heartbeat_at = EXCLUDED.heartbeat_at, record = EXCLUDED.record"
)

_REGISTRY_REMOVE = "DELETE FROM {s}.registry WHERE run = %(run)s"

_EVENT = (
    "WITH ins AS (INSERT INTO {s}.events (run, event) VALUES (%(run)s, %(event)s::json)"
    " RETURNING pos) SELECT pg_notify(%(channel)s, %(run)s) FROM ins"
)


# A step's session named or dropped: merged into the workspace's document under the lock its
# read-modify-write (a wake) takes, so neither overwrites the other. Session ids and step
# names never hold the \\u0000 escape, so the document can go through jsonb for the merge.
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
_LINEAGE_PUT = (
    "INSERT INTO {s}.lineage (workspace_id, workspace, woke, steps)"
    " VALUES (%(workspace_id)s, %(workspace)s, %(woke)s,"
    " json_build_object(%(step)s::text, %(sid)s::text))"
    " ON CONFLICT (workspace_id) DO UPDATE SET"
    " steps = (lineage.steps::jsonb || jsonb_build_object(%(step)s::text, %(sid)s::text))::json"
)
_LINEAGE_DROP = (
    "UPDATE {s}.lineage SET steps = (steps::jsonb - %(step)s::text)::json"
    " WHERE workspace_id = %(workspace_id)s AND steps->>%(step)s::text = %(sid)s::text"
)


def workspace_lock(conn: Conn, sql: Sql, what: str, workspace_id: str) -> None:
    """Hold ``what``'s lock of one workspace until the transaction ends (a read-modify-write
    of its lineage or registry, and the kept writes that merge into them)."""
    conn.execute(_LOCK, (f"flower-{what}:{sql.schema}:{workspace_id}",))


def lineage_put(conn: Conn, sql: Sql, _epoch: int, args: dict[str, Any], _: Any) -> None:
    """``args``: ``workspace_id``, ``workspace``, ``woke`` (for a first entry), ``step``,
    ``sid``."""
    with conn.transaction():  # the lock lasts until the write is done (a savepoint in one)
        workspace_lock(conn, sql, "lineage", args["workspace_id"])
        conn.execute(sql(_LINEAGE_PUT), args)


def lineage_drop(conn: Conn, sql: Sql, _epoch: int, args: dict[str, Any], _: Any) -> None:
    """``args``: ``workspace_id``, ``step``, ``sid`` (dropped only if the entry still names
    it)."""
    with conn.transaction():  # the lock lasts until the write is done (a savepoint in one)
        workspace_lock(conn, sql, "lineage", args["workspace_id"])
        conn.execute(sql(_LINEAGE_DROP), args)


def manifest_append(conn: Conn, sql: Sql, _epoch: int, args: dict[str, Any], _: Any) -> None:
    """``args``: ``workspace_id``, ``row`` (the manifest row)."""
    conn.execute(sql(_MANIFEST), {**args, "row": Json(args["row"])})


def registry_write(conn: Conn, sql: Sql, _epoch: int, args: dict[str, Any], live: Any) -> None:
    """``args``: ``run``, ``workspace_id``, ``started_at``, ``host``, ``record`` (without
    ``host`` and ``heartbeat_at``), ``at`` (the writer's clock)."""
    heartbeat = NOW if live is not None else "%(at)s"
    template = _REGISTRY.replace("{heartbeat}", heartbeat)
    conn.execute(sql(template), {**args, "record": Json(args["record"])})


def registry_remove(conn: Conn, sql: Sql, _epoch: int, args: dict[str, Any], _: Any) -> None:
    """``args``: ``run`` (its record is forgotten: a start that was refused leaves no trace,
    even when it is refused during an outage — after the record's own write, in order)."""
    conn.execute(sql(_REGISTRY_REMOVE), args)


def event_append(conn: Conn, sql: Sql, _epoch: int, args: dict[str, Any], _: Any) -> None:
    """``args``: ``run``, ``event``, ``channel`` (the schema's NOTIFY channel)."""
    conn.execute(sql(_EVENT), {**args, "event": Json(args["event"])})


#: The kept writes by name (the spool records name them).
OPS: dict[str, Op] = {
    "lineage.put": lineage_put,
    "lineage.drop": lineage_drop,
    "manifest.append": manifest_append,
    "registry.write": registry_write,
    "registry.remove": registry_remove,
    "events.append": event_append,
}
