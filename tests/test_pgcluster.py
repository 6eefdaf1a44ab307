"""The sandbox's Postgres cluster (weknora_nb/sandbox/pgcluster.py): databases built once under their name,
each use recorded, and those unused for a week dropped, in the real cluster, except while a build, a use or a
session holds them."""

from __future__ import annotations

import secrets
import time
from datetime import timedelta

import pytest

from weknora_nb.sandbox.pgcluster import _USES, UNUSED_FOR, _drop_if_unused, cluster


@pytest.fixture
def names():
    """Unique database names for one test (what ensure_database would build), dropped at the end."""
    made: list[str] = []

    def make(prefix: str = "wktest") -> str:
        made.append(f"{prefix}_{secrets.token_hex(6)}")
        return made[-1]

    yield make
    pg = cluster()
    with pg.connect() as admin:
        for name in made:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f"DELETE FROM {_USES} WHERE name = %s", (name,))


def _build(db) -> None:
    db.execute("CREATE TABLE t (x int)")
    db.execute("INSERT INTO t VALUES (1)")


def _exists(name: str) -> bool:
    with cluster().connect() as admin:
        return admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def _sessions_gone(name: str, seconds: float = 30.0) -> None:
    """Wait until the server has seen every session on ``name`` end: a closed connection's backend leaves
    ``pg_stat_activity`` a moment after the client returns (Postgres ends it asynchronously)."""
    deadline = time.monotonic() + seconds
    with cluster().connect() as admin:
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE datname = %s", (name,)).fetchone():
            assert time.monotonic() < deadline, f"a session on {name} is still there after {seconds} s"
            time.sleep(0.02)


def _age(name: str, days: float) -> None:
    with cluster().connect() as admin:
        admin.execute(f"UPDATE {_USES} SET used_at = now() - %s WHERE name = %s", (timedelta(days=days), name))


def test_a_database_unused_for_a_week_is_dropped_and_a_recent_one_kept(names):
    pg = cluster()
    old, recent = names(), names()
    for name in (old, recent):
        pg.ensure_database(name, _build)
    _age(old, 8)
    _age(recent, 6)
    _sessions_gone(old)  # the build's session
    dropped = pg.prune()
    assert old in dropped and not _exists(old)
    assert recent not in dropped and _exists(recent)
    assert timedelta(days=7) == UNUSED_FOR


def test_a_use_counts_as_new_and_a_dropped_database_is_built_again(names):
    pg = cluster()
    name = names()
    pg.ensure_database(name, _build)
    _age(name, 30)
    pg.ensure_database(name, _build)  # asked for again: its clock starts anew
    assert name not in pg.prune()
    _age(name, 30)
    _sessions_gone(name)
    assert name in pg.prune()
    pg.ensure_database(name, _build)  # needed later: built again, nothing lost but the time
    with pg.connect(name) as db:
        assert db.execute("SELECT x FROM t").fetchall() == [(1,)]


def test_a_connected_session_or_a_held_build_lock_keeps_an_old_database(names):
    pg = cluster()
    connected, building = names(), names()
    for name in (connected, building):
        pg.ensure_database(name, _build)
        _age(name, 10)
    with pg.connect(connected) as session, pg.connect() as builder:
        session.execute("SELECT 1")
        builder.execute("SELECT pg_advisory_lock(hashtext(%s))", (building,))  # what ensure_database holds
        dropped = pg.prune()
        builder.execute("SELECT pg_advisory_unlock(hashtext(%s))", (building,))
    assert connected not in dropped and _exists(connected)
    assert building not in dropped and _exists(building)
    _sessions_gone(connected)
    assert {connected, building} <= set(pg.prune())  # once free, they go


class _SessionsUnseen:
    """An admin connection whose look at pg_stat_activity finds no session: a session that connects between
    that look and the DROP."""

    def __init__(self, conn):
        self.conn = conn

    def execute(self, query, params=None):
        if "pg_stat_activity" in query:
            return self.conn.execute("SELECT 1 WHERE false")
        return self.conn.execute(query, params)


@pytest.mark.slow  # DROP DATABASE waits 5 s for the session to leave before it refuses
def test_a_session_that_connects_after_the_look_still_keeps_the_database(names):
    pg = cluster()
    name = names()
    pg.ensure_database(name, _build)
    _age(name, 10)
    with pg.connect(name) as session, pg.connect() as admin:
        session.execute("SELECT 1")
        assert not _drop_if_unused(_SessionsUnseen(admin), name, UNUSED_FOR)
    assert _exists(name)
    _sessions_gone(name)
    assert name in pg.prune()


def test_a_sandbox_database_built_before_uses_were_recorded_gets_a_week_from_now(names):
    pg = cluster()
    name = names("wk")
    with pg.connect() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    assert name not in pg.prune()
    with pg.connect() as admin:
        used = admin.execute(f"SELECT now() - used_at FROM {_USES} WHERE name = %s", (name,)).fetchone()
    assert used is not None and used[0] < timedelta(minutes=5)
    other = names("notours")
    with pg.connect() as admin:
        admin.execute(f'CREATE DATABASE "{other}"')
    pg.prune()
    with pg.connect() as admin:
        assert admin.execute(f"SELECT 1 FROM {_USES} WHERE name = %s", (other,)).fetchone() is None  # not ours
