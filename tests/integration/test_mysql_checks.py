"""Integration: start-up failures of MysqlSource against the real MariaDB.

Wrong password (fatal, password never shown), unreachable host (not fatal, names host and port,
one attempt, the worker loop retries), missing privileges (fatal, names them), and a server_id
already used by another replica (fatal).
"""

from __future__ import annotations

import os

import pytest

from lapidus.workers.base import BackendError

# The fixtures come in as a plugin, so test arguments do not shadow imported names.
pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import next_server_id  # noqa: E402

pytestmark = pytest.mark.integration

PASSWORD = "S3cret-pw-never-shown"


@pytest.fixture
def limited_user(sql):
    """A user with a password and SELECT only (no replication privileges)."""
    name = f"lapidus_t_{os.getpid()}"
    sql.run(f"DROP USER IF EXISTS '{name}'@'%'",
            f"CREATE USER '{name}'@'%' IDENTIFIED BY '{PASSWORD}'",
            f"GRANT SELECT ON *.* TO '{name}'@'%'")
    yield name
    sql.run(f"DROP USER IF EXISTS '{name}'@'%'")


def test_wrong_password_is_fatal_and_never_shows_the_password(limited_user, open_source):
    wrong = "not-the-" + PASSWORD
    with pytest.raises(BackendError) as failure:
        open_source(user=limited_user, password=wrong)
    message = str(failure.value)
    assert failure.value.fatal
    assert limited_user in message and "127.0.0.1:3306" in message and "password" in message
    assert wrong not in message and PASSWORD not in message


def test_missing_replication_privileges_are_fatal_and_named(limited_user, open_source):
    with pytest.raises(BackendError) as failure:
        open_source(user=limited_user, password=PASSWORD)
    message = str(failure.value)
    assert failure.value.fatal
    assert "lacks REPLICATION SLAVE, REPLICATION CLIENT" in message
    assert f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{limited_user}'" in message
    assert PASSWORD not in message


def test_unreachable_host_is_one_attempt_and_a_non_fatal_error_naming_host_and_port(
        open_source):
    # retrying is the worker loop's job (lapidus/workers/waiting.py), not the source's
    with pytest.raises(BackendError) as failure:
        open_source(host="127.0.0.1", port=1)
    assert not failure.value.fatal
    assert "cannot reach MySQL/MariaDB at 127.0.0.1:1" in str(failure.value)


def test_server_id_used_by_another_replica_is_fatal(sql, open_source):
    shared = next_server_id()
    first = open_source(name="first", server_id=shared)
    with pytest.raises(BackendError) as failure:
        open_source(name="second", server_id=shared)
    assert failure.value.fatal
    assert f"server_id {shared} is already used by the replica \"lapidus/first@" in \
        str(failure.value)
    first.close()


def test_a_newcomer_with_our_server_id_makes_the_first_reader_fatal_naming_the_id(
        sql, open_source, monkeypatch):
    """Without REPLICATION MASTER ADMIN the newcomer cannot see the first reader and connects;
    the server then drops the first one, which must not reconnect (and knock the newcomer
    off in turn) but fail, naming the id."""
    from lapidus.workers.mysql import checks

    shared = next_server_id()
    first = open_source(name="first", server_id=shared)
    first.read(10, 0.05)
    visible = checks.read_facts

    def blind(conn):
        facts = visible(conn)
        facts.replicas, facts.replicas_visible = [], False
        return facts

    monkeypatch.setattr(checks, "read_facts", blind)
    open_source(name="second", server_id=shared)
    sql.run("CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)")
    with pytest.raises(BackendError) as failure:
        for _ in range(50):
            first.read(10, 0.1)
    assert failure.value.fatal, failure.value
    assert f"same server_id {shared}" in str(failure.value)


def test_reopening_with_our_own_server_id_is_not_a_clash(sql, open_source):
    shared = next_server_id()
    first = open_source(name="again", server_id=shared)
    first.read(10, 0.05)
    again = open_source(name="again", server_id=shared)     # the worker restarting
    assert again.read(10, 0.05).events == []
