"""flower's tables in PostgreSQL: one schema of their own, versioned, upgraded in place.

Everything lives in one schema (``flower`` unless the URL says ``?schema=``), so a shared
database stays tidy and two installations can share one database. ``<schema>.schema_version``
holds one row, the version; :data:`MIGRATIONS` is the ordered list of what each version adds.
:func:`ensure` brings a database up to date: a current schema costs one query; otherwise the
missing migrations run in one transaction under an advisory lock, so processes that start at
once against an empty database wait for each other instead of failing on each other's
``CREATE``. A schema newer than this flower is refused (:class:`SchemaTooNew`): an older
flower must not write tables whose meaning it does not know.

Documents (manifest rows, registry records, cache entries, events, lineage steps) are
``json``, not ``jsonb``: ``jsonb`` refuses the ``\\u0000`` escape, which a model's or a tool's
text can hold, and flower never queries inside them. Transcript entries are JSON text, as
in SQLite: stored exactly, parsed only when loaded.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..._errors import FlowerError
from ...i18n import define, t

if TYPE_CHECKING:
    import psycopg

__all__ = ["CURRENT", "MIGRATIONS", "SchemaTooNew", "Sql", "ensure"]

define(
    {
        "state.schema.newer": (
            "{where} 里 flower 的表(schema {schema})是更新的 flower 建的(版本 {version},"
            "这个 flower 认得到 {current})",
            "flower's tables in {where} (schema {schema}) were made by a newer flower "
            "(version {version}; this one knows up to {current})",
        ),
        "state.schema.newer.hint": (
            "升级 flower,或者在地址里用另一个 schema(?schema=名字)",
            "upgrade flower, or use another schema in the URL (?schema=name)",
        ),
    }
)


class SchemaTooNew(FlowerError):
    """The database's flower schema was written by a newer flower."""


#: What each version adds, in order: version N is MIGRATIONS[:N] applied. Statements end
#: with ";" at the end of a line and name the schema as ``{s}``. Never edit one that
#: shipped: add one.
MIGRATIONS: list[str] = [
    # 1: sessions (the SDK's SessionStore), their fencing, the tool ledger, spool delivery
    """
    CREATE SEQUENCE {s}.epochs;
    CREATE TABLE {s}.fence (
        session_id text PRIMARY KEY,
        epoch      bigint NOT NULL,
        mtime      bigint NOT NULL
    );
    CREATE TABLE {s}.entries (
        seq  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        key  text NOT NULL,
        uuid text,
        data text NOT NULL
    );
    CREATE INDEX entries_by_key ON {s}.entries (key, seq);
    CREATE UNIQUE INDEX entries_uuid ON {s}.entries (key, uuid) WHERE uuid IS NOT NULL;
    CREATE TABLE {s}.meta (
        key         text PRIMARY KEY,
        project_key text NOT NULL,
        session_id  text NOT NULL,
        subpath     text,
        mtime       bigint NOT NULL
    );
    CREATE INDEX meta_by_session ON {s}.meta (session_id, project_key);
    CREATE INDEX meta_by_project ON {s}.meta (project_key, session_id);
    CREATE TABLE {s}.summaries (
        project_key text NOT NULL,
        session_id  text NOT NULL,
        mtime       bigint NOT NULL,
        data        text NOT NULL,
        PRIMARY KEY (project_key, session_id)
    );
    CREATE TABLE {s}.tool_calls (
        tool_use_id text PRIMARY KEY,
        session_id  text NOT NULL,
        agent_id    text,
        name        text NOT NULL,
        input       text NOT NULL,
        message     text,
        state       text NOT NULL,
        response    text,
        content     text,
        is_error    boolean NOT NULL DEFAULT false,
        started_at  double precision NOT NULL,
        ended_at    double precision
    );
    CREATE INDEX tool_calls_by_session ON {s}.tool_calls (session_id, started_at);
    CREATE TABLE {s}.spools (
        spool     text PRIMARY KEY,
        delivered bigint NOT NULL
    );
    CREATE FUNCTION {s}.stale_summary() RETURNS integer LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'stale summary' USING ERRCODE = 'FL001'; END $$
    """,
    # 2: the rest of a run's state: lineage, manifest, registry, cache, events
    """
    CREATE TABLE {s}.lineage (
        workspace_id text PRIMARY KEY,
        workspace    text NOT NULL,
        woke         integer NOT NULL,
        steps        json NOT NULL
    );
    CREATE TABLE {s}.lineage_archive (
        id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        workspace_id text NOT NULL,
        stamp        text NOT NULL,
        workspace    text NOT NULL,
        woke         integer NOT NULL,
        steps        json NOT NULL
    );
    CREATE INDEX lineage_archive_by_workspace ON {s}.lineage_archive (workspace_id, id);
    CREATE TABLE {s}.manifest (
        id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        workspace_id text NOT NULL,
        row          json NOT NULL
    );
    CREATE INDEX manifest_by_workspace ON {s}.manifest (workspace_id, id);
    CREATE TABLE {s}.registry (
        run          text PRIMARY KEY,
        workspace_id text,
        started_at   double precision NOT NULL,
        host         text NOT NULL,
        heartbeat_at double precision NOT NULL,
        record       json NOT NULL
    );
    CREATE INDEX registry_by_workspace ON {s}.registry (workspace_id, started_at);
    CREATE TABLE {s}.cache (
        key        text PRIMARY KEY,
        created_at double precision NOT NULL,
        entry      json NOT NULL
    );
    CREATE INDEX cache_by_age ON {s}.cache (created_at);
    CREATE TABLE {s}.events (
        pos   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run   text NOT NULL,
        event json NOT NULL
    );
    CREATE INDEX events_by_run ON {s}.events (run, pos)
    """,
    # 3: a cluster's workers, each as it last said it was (``flower-super workers``)
    """
    CREATE TABLE {s}.workers (
        name         text PRIMARY KEY,
        queue        text NOT NULL,
        host         text NOT NULL,
        started_at   double precision NOT NULL,
        heartbeat_at double precision NOT NULL,
        stopped_at   double precision,
        record       json NOT NULL
    );
    CREATE INDEX workers_by_queue ON {s}.workers (queue, name)
    """,
]
CURRENT = len(MIGRATIONS)


class Sql:
    """SQL templates of this module's form (``{s}`` for the schema) made concrete for one
    schema, each formatted once."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._quoted = '"' + schema.replace('"', '""') + '"'
        self._made: dict[str, str] = {}
        #: (project_key, session_id) -> (mtime, data) of the summaries this process folded
        #: last: :func:`flower.state.postgres.fenced.append`'s one-round-trip path.
        self.summaries: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}

    def __call__(self, template: str) -> str:
        made = self._made.get(template)
        if made is None:
            made = self._made[template] = template.replace("{s}", self._quoted)
        return made


def ensure(conn: psycopg.Connection[tuple[Any, ...]], sql: Sql, where: str) -> None:
    """Bring the schema to :data:`CURRENT` (``conn`` in autocommit mode). ``where`` names the
    database for people (its URL, masked)."""
    import psycopg

    try:
        row = conn.execute(sql("SELECT version FROM {s}.schema_version")).fetchone()
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        row = None
    if row is not None and row[0] == CURRENT:
        return
    _refuse_newer(row[0] if row else 0, sql, where)
    with conn.transaction():
        lock = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
        conn.execute(lock, (f"flower-schema:{sql.schema}",))
        conn.execute(sql("CREATE SCHEMA IF NOT EXISTS {s}"))
        conn.execute(
            sql("CREATE TABLE IF NOT EXISTS {s}.schema_version (version integer NOT NULL)")
        )
        row = conn.execute(sql("SELECT version FROM {s}.schema_version FOR UPDATE")).fetchone()
        version = int(row[0]) if row else 0
        _refuse_newer(version, sql, where)
        for migration in MIGRATIONS[version:]:
            for statement in statements(migration):
                conn.execute(sql(statement))
        if row is None:
            conn.execute(sql("INSERT INTO {s}.schema_version (version) VALUES (%s)"), (CURRENT,))
        else:
            conn.execute(sql("UPDATE {s}.schema_version SET version = %s"), (CURRENT,))


def statements(migration: str) -> list[str]:
    """A migration's statements, in order."""
    return [s for s in re.split(r";\s*\n", migration) if s.strip()]


def _refuse_newer(version: int, sql: Sql, where: str) -> None:
    if version > CURRENT:
        raise SchemaTooNew(
            t(
                "state.schema.newer",
                where=where,
                schema=sql.schema,
                version=version,
                current=CURRENT,
            ),
            hint=t("state.schema.newer.hint"),
        )
