"""PostgreSQL over TLS: sslrootcert/sslcert/sslkey reach the worker's connections and
pg_recvlogical, against the local server with a CA the test makes.

The shared server's TLS is switched on without a restart (ALTER SYSTEM SET ssl, ssl_cert_file,
ssl_key_file; pg_reload_conf()) and always put back in a finally.  Its files live in a fixed
directory that is overwritten, never deleted: a run killed before its finally leaves settings
that still name existing files, so the server can still start.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import pytest

from tests.conftest import wait_until
from tests.integration.conftest import PG, ctl, pg_backend, pg_connect
from tests.integration.tls_fixtures import make_pki

# serial: switches the shared PostgreSQL server's TLS on and off
pytestmark = [pytest.mark.integration, pytest.mark.serial]

SERVER_TLS_DIR = Path("/var/lib/postgresql/lapidus-tls-test")
SETTINGS = ("ssl", "ssl_cert_file", "ssl_key_file")


def tls_connects(**extra) -> bool:
    settings = {"sslmode": "require", **extra}
    try:
        psycopg2.connect(dbname="postgres", connect_timeout=3, **PG, **settings).close()
    except psycopg2.OperationalError:
        return False
    return True


@contextmanager
def server_tls(pki):
    """TLS on at the shared server with ``pki``'s server certificate, for the block."""
    if os.geteuid() != 0:
        pytest.skip("switching the server's TLS on needs root (the files go to the postgres user)")
    postgres = pwd.getpwnam("postgres")
    SERVER_TLS_DIR.mkdir(mode=0o700, exist_ok=True)
    os.chown(SERVER_TLS_DIR, postgres.pw_uid, postgres.pw_gid)
    with open(SERVER_TLS_DIR / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # one TLS test at a time on this server
        for source, name, mode in ((pki.server_cert, "server.pem", 0o644),
                                   (pki.server_key, "server.key", 0o600)):
            target = SERVER_TLS_DIR / name
            shutil.copyfile(source, target)
            os.chown(target, postgres.pw_uid, postgres.pw_gid)
            os.chmod(target, mode)
        admin = pg_connect()
        with admin.cursor() as cur:
            cur.execute("SELECT name, setting, sourcefile FROM pg_settings WHERE name = ANY(%s)",
                        (list(SETTINGS),))
            before = {name: (setting, sourcefile) for name, setting, sourcefile in cur.fetchall()}
        try:
            with admin.cursor() as cur:
                for name, file in (("ssl_cert_file", "server.pem"), ("ssl_key_file", "server.key")):
                    cur.execute(f"ALTER SYSTEM SET {name} = %s", (str(SERVER_TLS_DIR / file),))
                cur.execute("ALTER SYSTEM SET ssl = on")
                cur.execute("SELECT pg_reload_conf()")
            wait_until(lambda: tls_connects(sslrootcert=str(pki.ca), sslmode="verify-full"), 20,
                       message="the server to accept TLS with the test's certificate")
            yield
        finally:
            with admin.cursor() as cur:
                for name, (setting, sourcefile) in before.items():
                    # A value someone set with ALTER SYSTEM goes back; anything else is reset.
                    if sourcefile and sourcefile.endswith("postgresql.auto.conf"):
                        cur.execute(f"ALTER SYSTEM SET {name} = %s", (setting,))
                    else:
                        cur.execute(f"ALTER SYSTEM RESET {name}")
                cur.execute("SELECT pg_reload_conf()")
            if before["ssl"][0] == "off":
                wait_until(lambda: not tls_connects(), 20,
                           message="the server's TLS to be off again")
            admin.close()


def connections_of(db):
    """(backend_type, ssl) of every connection to the test database but the test's own."""
    return db.sql("SELECT a.backend_type, s.ssl FROM pg_stat_activity a "
                  "JOIN pg_stat_ssl s USING (pid) "
                  "WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()")


def test_worker_and_pg_recvlogical_use_tls_with_the_configured_ca(
        lapidus_factory, pg_db, tmp_path):
    pki = make_pki(tmp_path / "pki")
    shutil.copyfile(pki.ca, tmp_path / "ca.pem")     # relative to the configuration file
    pg_db.sql("CREATE TABLE items (id int PRIMARY KEY, name text)")
    with server_tls(pki):
        proc = lapidus_factory({"backends": [pg_backend(
            pg_db, sslmode="verify-full", sslrootcert="ca.pem")], "plugins": {"stdout": {}}})
        proc.wait_log('"streaming"')
        pg_db.sql("INSERT INTO items VALUES (1, 'over tls')")
        assert proc.wait_events(1)[0]["item"] == {"id": 1, "name": "over tls"}
        connections = wait_until(
            lambda: (lambda rows: rows if any(t == "walsender" for t, _ in rows) else None)(
                connections_of(pg_db)), 20, message="pg_recvlogical's walsender")
        assert connections and all(ssl for _, ssl in connections), connections
        # lapidusctl slots connects with the backend's TLS settings too
        code, out, err = ctl(proc.config_path, "slots", "--json")
        assert code == 0, err
        assert f"{pg_db.name}_pg" in {row["slot"] for row in json.loads(out)}


def test_a_server_certificate_from_another_ca_is_a_clear_fatal(lapidus_factory, pg_db, tmp_path):
    pki = make_pki(tmp_path / "pki")
    with server_tls(pki):
        proc = lapidus_factory({"backends": [pg_backend(
            pg_db, sslmode="verify-full", sslrootcert=str(pki.wrong_ca))],
            "plugins": {"stdout": {}}})
        assert proc.proc.wait(30) == 1      # its only backend FATAL: the supervisor exits 1
    log = proc.log()
    assert "backend is FATAL" in log and "is not trusted" in log and "set sslrootcert" in log
    assert "retrying" not in log and "Traceback" not in log


def test_a_missing_certificate_file_is_a_clear_fatal(lapidus_factory, pg_db, tmp_path):
    proc = lapidus_factory({"backends": [pg_backend(
        pg_db, sslmode="verify-full", sslrootcert="missing-ca.pem")], "plugins": {"stdout": {}}})
    assert proc.proc.wait(30) == 1
    log = proc.log()
    assert f"sslrootcert file {tmp_path / 'missing-ca.pem'} does not exist" in log, log[-2000:]
    assert "Traceback" not in log


def test_lapidusctl_slots_never_falls_back_to_a_plain_connection(pg_db, tmp_path):
    """sslmode = "verify-full" holds for lapidusctl's own connections: against a server
    without TLS, slots and drop-slot refuse with the reason instead of listing in plain text."""
    if tls_connects():
        pytest.skip("the server has TLS on right now")
    pki = make_pki(tmp_path / "pki")
    path = tmp_path / "lapidus.json"
    path.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "backends": [pg_backend(
        pg_db, sslmode="verify-full", sslrootcert=str(pki.ca))], "plugins": {"stdout": {}}}))
    for args in (("slots", "--json"), ("drop-slot", "lapidus_any", "--yes")):
        code, out, err = ctl(path, *args)
        assert code == 3, (code, out, err)
        assert out in ("", "[]\n"), out             # nothing listed from that server
        assert err.startswith('lapidusctl: backend "pg": ') and "does not offer TLS" in err, err
        assert "retrying" not in err and "Traceback" not in err


def test_verification_against_a_server_without_tls_is_a_clear_fatal(
        lapidus_factory, pg_db, tmp_path):
    if tls_connects():
        pytest.skip("the server has TLS on right now")
    pki = make_pki(tmp_path / "pki")
    proc = lapidus_factory({"backends": [pg_backend(
        pg_db, sslmode="verify-full", sslrootcert=str(pki.ca))], "plugins": {"stdout": {}}})
    assert proc.proc.wait(30) == 1
    log = proc.log()
    assert "does not offer TLS" in log and "sslmode=verify-full" in log, log[-2000:]
