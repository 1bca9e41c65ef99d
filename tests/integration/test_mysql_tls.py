"""MySQL/MariaDB over TLS: ssl_ca/ssl_cert/ssl_key/ssl_verify reach the query connection and
the binlog stream, against the local MariaDB with a CA the test makes.

MariaDB 10.11 cannot change its TLS file paths at run time, so scripts/setup-local points them
at /etc/mysql/lapidus-tls/ (a self-signed placeholder).  A test writes its own CA-signed
certificate there and runs FLUSH SSL (which re-reads the files), and always puts the
placeholder back and runs FLUSH SSL again in a finally.  The Source is driven directly, except
in the supervised tests at the end (configuration file -> worker).
"""

from __future__ import annotations

import fcntl
import os
import pwd
import socket
import ssl
import threading
from contextlib import contextmanager
from pathlib import Path

import pymysql
import pytest

from lapidus.workers.base import BackendError
from tests.conftest import wait_until
from tests.integration.tls_fixtures import make_pki

pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.mysql_fixtures import (  # noqa: E402
    HOST, PORT, lapidus_backend, read_count, root_connection,
)

# serial: swaps the shared MariaDB server's certificate (FLUSH SSL)
pytestmark = [pytest.mark.integration, pytest.mark.serial]

TLS_DIR = Path("/etc/mysql/lapidus-tls")
FILES = ("ca.pem", "server-cert.pem", "server-key.pem")


def verified_connect(ca: Path) -> bool:
    try:
        root_connection(connect_timeout=3, ssl_ca=str(ca), ssl_verify_cert=True,
                        ssl_verify_identity=False).close()
    except pymysql.err.MySQLError:
        return False
    return True


@contextmanager
def server_certificate(pki):
    """The server presents ``pki``'s certificate to new connections, for the block."""
    if os.geteuid() != 0:
        pytest.skip("replacing the server's TLS files needs root")
    with root_connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@have_ssl, @@ssl_cert")
        have_ssl, cert = cur.fetchone()
    if have_ssl != "YES" or cert != str(TLS_DIR / "server-cert.pem"):
        pytest.skip(f"the server's TLS files are not setup-local's (have_ssl={have_ssl}, "
                    f"ssl_cert={cert}); run scripts/setup-local")
    mysql = pwd.getpwnam("mysql")
    with open(TLS_DIR / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # one TLS test at a time on this server
        placeholder = {name: (TLS_DIR / name).read_bytes() for name in FILES}
        try:
            put_files({"ca.pem": pki.ca.read_bytes(),
                       "server-cert.pem": pki.server_cert.read_bytes(),
                       "server-key.pem": pki.server_key.read_bytes()}, mysql)
            flush_ssl()
            wait_until(lambda: verified_connect(pki.ca), 20,
                       message="the server to present the test's certificate")
            yield
        finally:
            put_files(placeholder, mysql)
            flush_ssl()


def put_files(contents: dict, owner) -> None:
    for name, data in contents.items():
        temporary = TLS_DIR / f".{name}.tmp"
        temporary.write_bytes(data)
        os.chown(temporary, owner.pw_uid, owner.pw_gid)
        os.chmod(temporary, 0o600 if name.endswith("key.pem") else 0o644)
        os.replace(temporary, TLS_DIR / name)


def flush_ssl() -> None:
    with root_connection() as conn, conn.cursor() as cur:
        cur.execute("FLUSH SSL")


def tls_version(connection) -> str:
    sock = getattr(connection, "_sock", None)
    return sock.version() if isinstance(sock, ssl.SSLSocket) else ""


def test_query_connection_and_binlog_stream_use_tls(sql, open_source, tmp_path):
    pki = make_pki(tmp_path / "pki")
    sql.run("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))")
    with server_certificate(pki):
        source = open_source(ssl_ca=str(pki.ca))          # ssl_verify defaults to identity
        sql.run("INSERT INTO items VALUES (1, 'over tls')")
        events, _ = read_count(source, 1)
        assert events[0].item == {"id": 1, "name": "over tls"}
        with source._conn.cursor() as cur:                 # the server's view
            cur.execute("SHOW STATUS LIKE 'Ssl_cipher'")
            assert cur.fetchone()[1], "the query connection is not encrypted"
        reader = source._reader
        assert tls_version(source._conn).startswith("TLS")
        assert tls_version(reader._stream_connection).startswith("TLS")
        assert tls_version(reader._ctl_connection).startswith("TLS")


def test_without_tls_settings_both_connections_encrypt_with_one_shared_context(sql, open_source):
    """pymysql's preferred mode: TLS when the server offers it (the placeholder certificate of
    scripts/setup-local), nothing verified, and one context for every connection rather than
    one with the system's CA store loaded for each."""
    sql.run("CREATE TABLE items (id INT PRIMARY KEY)")
    source = open_source()
    sql.run("INSERT INTO items VALUES (1)")
    read_count(source, 1)
    reader = source._reader
    connections = (source._conn, reader._stream_connection, reader._ctl_connection)
    assert all(tls_version(c).startswith("TLS") for c in connections)
    contexts = {id(c._sock.context) for c in connections}
    assert len(contexts) == 1
    context = source._conn._sock.context
    assert context.verify_mode == ssl.CERT_NONE and context.get_ca_certs() == []


def test_a_server_certificate_from_another_ca_is_a_clear_fatal(sql, open_source, tmp_path):
    pki = make_pki(tmp_path / "pki")
    with server_certificate(pki):
        with pytest.raises(BackendError) as caught:
            open_source(ssl_ca=str(pki.wrong_ca))
    assert caught.value.fatal
    assert "is not trusted" in str(caught.value) and "set ssl_ca" in str(caught.value)


def test_identity_is_checked_and_ca_mode_skips_it(sql, open_source, tmp_path):
    """A certificate for another host name: refused by "identity", accepted by "ca"."""
    pki = make_pki(tmp_path / "pki", names="DNS:db.example.invalid")
    with server_certificate(pki):
        with pytest.raises(BackendError) as caught:
            open_source(ssl_ca=str(pki.ca), ssl_verify="identity")
        assert caught.value.fatal and 'ssl_verify = "ca"' in str(caught.value)
        source = open_source(name="crm2", ssl_ca=str(pki.ca), ssl_verify="ca")
        assert tls_version(source._conn).startswith("TLS")


def test_a_missing_file_is_a_clear_fatal(sql, open_source, tmp_path):
    with pytest.raises(BackendError) as caught:
        open_source(ssl_ca=str(tmp_path / "nope.pem"))
    assert caught.value.fatal
    assert f"ssl_ca file {tmp_path / 'nope.pem'} does not exist" in str(caught.value)


class NoTlsGreeting:
    """A TCP proxy to the server that removes CLIENT_SSL from the server's greeting: a server
    without TLS, as the client sees it, without touching the shared server."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with client, socket.create_connection((HOST, PORT), timeout=5) as upstream:
                header = upstream.recv(4, socket.MSG_WAITALL)
                payload = bytearray(upstream.recv(int.from_bytes(header[:3], "little"),
                                                  socket.MSG_WAITALL))
                flags_at = payload.index(0, 1) + 1 + 4 + 8 + 1   # version, thread id, salt
                flags = int.from_bytes(payload[flags_at:flags_at + 2], "little") & ~0x0800
                payload[flags_at:flags_at + 2] = flags.to_bytes(2, "little")
                client.sendall(header + bytes(payload))
                client.recv(1)                # the client gives up here; then close both

    def close(self):
        self.listener.close()


def test_verification_against_a_server_without_tls_is_a_clear_fatal(sql, open_source, tmp_path):
    pki = make_pki(tmp_path / "pki")
    proxy = NoTlsGreeting()
    try:
        with pytest.raises(BackendError) as caught:
            open_source(port=proxy.port, ssl_ca=str(pki.ca))
    finally:
        proxy.close()
    assert caught.value.fatal and "does not offer TLS" in str(caught.value)


def test_supervised_stream_over_tls_with_a_ca_relative_to_the_config(
        lapidus_factory, sql, tmp_path):
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "ca.pem").write_bytes(pki.ca.read_bytes())
    sql.run("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(20))")
    with server_certificate(pki):
        proc = lapidus_factory({"backends": [lapidus_backend(ssl_ca="ca.pem")],
                                "plugins": {"stdout": {}}})
        proc.wait_log('"streaming"')
        sql.run("INSERT INTO items VALUES (1, 'over tls')")
        assert proc.wait_events(1)[0]["item"] == {"id": 1, "name": "over tls"}


def test_supervised_wrong_ca_is_fatal_and_lapidus_exits(lapidus_factory, sql, tmp_path):
    pki = make_pki(tmp_path / "pki")
    with server_certificate(pki):
        proc = lapidus_factory({"backends": [lapidus_backend(ssl_ca=str(pki.wrong_ca))],
                                "plugins": {"stdout": {}}})
        assert proc.proc.wait(30) == 1        # its only backend FATAL: the supervisor exits 1
    log = proc.log()
    assert "backend is FATAL" in log and "is not trusted" in log and "Traceback" not in log
