"""A read-only session on WeKnora's Postgres, through a DSN: what the database checks and the vector-store trace
run their queries in.

:func:`connect_readonly` sets every transaction read-only (``default_transaction_read_only``), a
``statement_timeout`` per statement, a bounded ``work_mem`` and a ``lock_timeout``, and finds out which of
WeKnora's tables and columns the role may read (:meth:`PgSession.has`), so that a check adapts to the schema
of the release it meets. The DSN's password appears in no message: every text a session shows goes through
:meth:`PgSession.masked`. psycopg is imported only when a session is opened.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from weknora_nb.collect.http.redact import MASK, redact_dsn, redact_text
from weknora_nb.core.errors import AuthFailed, ConnectFailed, UsageError


@dataclass
class PgSession:
    """A read-only connection and what it found out about the schema (columns per table, readable tables)."""

    conn: Any
    shown_dsn: str
    secret: str | None = field(repr=False)
    columns: dict[str, set[str]] = field(default_factory=dict)

    def has(self, table: str, column: str | None = None) -> bool:
        """Whether ``table`` (readable) has ``column`` (or just exists, readable, when no column is named)."""
        cols = self.columns.get(table)
        return cols is not None and (column is None or column in cols)

    def rows(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """The rows of one query (the caller translates its errors: ``database._step``)."""
        return list(self.conn.execute(sql, params).fetchall())

    def masked(self, text: str) -> str:
        """``text`` with the DSN's password (if it slipped in) and URL secrets masked."""
        if self.secret:
            text = text.replace(self.secret, MASK)
        return redact_text(text)


def connect_readonly(dsn: str, *, statement_timeout_s: float = 60.0, work_mem: str = "64MB",
                     connect_timeout_s: float = 10.0, application_name: str = "weknora-nb check") -> PgSession:
    """A read-only session on ``dsn``: every transaction read-only, each statement at most
    ``statement_timeout_s`` seconds, sorts and hashes within ``work_mem``. Raises :class:`AuthFailed` (a refused
    password or role), :class:`ConnectFailed` (no server), :class:`UsageError` (not a connection string)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    if not isinstance(dsn, str) or not dsn.strip():
        raise UsageError(argument="--dsn", allowed="a libpq connection string or postgresql:// URI", got=dsn)
    _check_uri_userinfo(dsn)
    try:
        secret = conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:  # its message may quote a piece of the password: not shown
        raise UsageError("--dsn is not a libpq connection string (key=value pairs, or a postgresql:// URI): "
                         f"{redact_dsn(dsn)}") from None
    shown = redact_dsn(dsn)
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, round(connect_timeout_s)),
                               application_name=application_name)
    except psycopg.OperationalError as exc:
        text = one_line(str(exc), str(secret) if secret else None)
        kind = AuthFailed if re.search(r"password|authentication|role .* does not exist|permission denied", text,
                                       re.IGNORECASE) else ConnectFailed
        raise kind(f"cannot connect to Postgres {shown}: {text}") from None
    session = PgSession(conn, shown, str(secret) if secret else None)
    try:
        conn.execute("SET default_transaction_read_only = on")
        conn.execute(f"SET statement_timeout = {int(statement_timeout_s * 1000)}")
        conn.execute("SELECT set_config('work_mem', %s, false)", (work_mem,))
        conn.execute("SET lock_timeout = '5s'")
        session.columns = _readable_columns(session)
    except psycopg.Error as exc:
        conn.close()
        raise UsageError(f"cannot set up a read-only session on {shown}: {session.masked(one_line(str(exc), None))}"
                         ) from None
    return session


def _check_uri_userinfo(dsn: str) -> None:
    """:class:`UsageError` when a ``postgresql://`` URI's authority holds more than one ``@``: libpq splits the
    userinfo at the first one, so a password holding an ``@`` that is not written ``%40`` leaves its rest in the
    host name, which every later message (the driver's "could not translate host name ...") would show. Nothing
    of the connection string is shown."""
    scheme, sep, rest = dsn.strip().partition("://")
    if not sep or scheme.lower() not in ("postgresql", "postgres"):
        return
    authority = rest.split("/", 1)[0].split("?", 1)[0]
    if authority.count("@") > 1:
        raise UsageError("--dsn: the postgresql:// URI holds more than one '@' before its host: a password with an "
                         "'@' must be written %40 (percent-encoded); the connection string is not shown")


def one_line(text: str, secret: str | None) -> str:
    text = " ".join(text.split())
    if secret:
        text = text.replace(secret, MASK)
    return redact_text(text)[:400]


def _readable_columns(s: PgSession) -> dict[str, set[str]]:
    """Columns of WeKnora's tables the role may read (a table the role cannot SELECT is left out)."""
    rows = s.rows("SELECT c.relname, a.attname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid "
                  "WHERE c.oid IN (SELECT to_regclass(t) FROM unnest(%s::text[]) t) AND a.attnum > 0 "
                  "AND NOT a.attisdropped AND has_table_privilege(c.oid, 'SELECT')",
                  (["embeddings", "chunks", "knowledges", "knowledge_bases", "models"],))
    out: dict[str, set[str]] = {}
    for table, column in rows:
        out.setdefault(table, set()).add(column)
    return out


def data_errors() -> tuple[type[BaseException], ...]:
    """psycopg's errors about the data a query met (a bad cast, a wrong vector length)."""
    import psycopg

    return (psycopg.DataError,)
