"""The nats sink against private nats-servers that require a token, a user and password, an
NKey, or TLS: events arrive, secrets stay out of the log, and wrong settings are errors that say what to
change while the events wait."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path

import pytest

from lapidus.events import Record
from lapidus.sinks.base import SinkError
from lapidus.sinks.nats import NatsSink
from tests.conftest import wait_until
from tests.integration.conftest import pg_backend, running
from tests.integration.nats_fixtures import Watcher, private_nats

__all__ = ["private_nats"]   # fixture, imported for pytest

SECRET = "s3cr3t-value"


def make_certificates(directory: Path) -> dict:
    """A CA, and a certificate for 127.0.0.1 signed by it (openssl, EC keys: fast)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=Lapidus test CA")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    return {name: str(directory / name) for name in ("ca.pem", "server.pem", "server.key")}


def make_user_nkey(directory: Path):
    """(a file holding a new user NKey seed, its public key)."""
    import nacl.signing
    import nkeys

    seed = nkeys.encode_seed(nacl.signing.SigningKey.generate().encode(),
                             nkeys.PREFIX_BYTE_USER)
    path = directory / "user.nk"
    path.write_bytes(seed + b"\n")
    path.chmod(0o600)
    return str(path), nkeys.from_seed(bytearray(seed)).public_key.decode()


def secured(mode: str, server, tmp_path):
    """(nats-server options, the plugin's options, nats-py options, URL) for ``mode``."""
    if mode == "token":
        return ["--auth", SECRET], {"token": SECRET}, {"token": SECRET}, server.url
    if mode == "user_password":
        return (["--user", "lapidus", "--pass", SECRET], {"user": "lapidus", "password": SECRET},
                {"user": "lapidus", "password": SECRET}, server.url)
    if mode == "nkey":
        seed_file, public_key = make_user_nkey(tmp_path)
        (tmp_path / "nkey.conf").write_text(
            f'authorization {{ users = [ {{ nkey: "{public_key}" }} ] }}\n')
        return (["-c", str(tmp_path / "nkey.conf")], {"nkeys_seed": seed_file},
                {"nkeys_seed": seed_file}, server.url)
    certs = make_certificates(tmp_path)
    return (["--tls", "--tlscert", certs["server.pem"], "--tlskey", certs["server.key"]],
            {"tls_ca_file": certs["ca.pem"]},
            {"tls": ssl.create_default_context(cafile=certs["ca.pem"])},
            server.url.replace("nats://", "tls://"))


def start_lapidus(lapidus_factory, pg_db, url: str, plugin: dict):
    return lapidus_factory({"backends": [pg_backend(pg_db)],
                            "plugins": {"nats": {"server": url, "subject_prefix": "sec",
                                                 "reconnect_time_wait": 0.3, **plugin}}})


@pytest.mark.parametrize("mode", ["token", "user_password", "nkey", "tls"])
def test_events_arrive_over_an_authenticated_or_tls_connection(lapidus_factory, pg_db,
                                                               private_nats, tmp_path, mode):
    server_options, plugin, client, url = secured(mode, private_nats, tmp_path)
    private_nats.start(*server_options)
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    watcher = Watcher("sec.>", url=url, **client)
    try:
        proc = start_lapidus(lapidus_factory, pg_db, url, plugin)
        proc.wait_log('"nats connected"')
        wait_until(lambda: running(proc.config_path, "pg"), 30)   # its slot exists
        pg_db.sql("INSERT INTO t SELECT generate_series(1, 3)")
        seen = watcher.wait_count(3)
        assert sorted(m.subject for m in seen) == [f"sec.public.t.{i}" for i in (1, 2, 3)]
        assert SECRET not in proc.log()
    finally:
        watcher.close()


@pytest.mark.parametrize("mistake,expected", [
    ("wrong token", "the server refused the credentials"),
    ("no CA for the server's certificate", "set tls_ca_file to the CA that signed it"),
])
def test_wrong_connection_settings_say_what_to_change_and_events_wait(
        lapidus_factory, pg_db, private_nats, tmp_path, mistake, expected):
    mode = "token" if "token" in mistake else "tls"
    server_options, plugin, client, url = secured(mode, private_nats, tmp_path)
    private_nats.start(*server_options)
    pg_db.sql("CREATE TABLE t (id int PRIMARY KEY)")
    wrong = {"token": "not-the-token"} if mode == "token" else {}
    proc = start_lapidus(lapidus_factory, pg_db, url, wrong)
    proc.wait_log('"streaming"')            # the slot exists: the rows below are in its stream
    pg_db.sql("INSERT INTO t SELECT generate_series(1, 3)")
    proc.wait_log(expected)
    assert '"nats connected"' not in proc.log()
    assert SECRET not in proc.log() and "not-the-token" not in proc.log()
    # Put right, the held events arrive: nothing was dropped meanwhile.
    watcher = Watcher("sec.>", url=url, **client)
    try:
        proc.terminate()
        proc = start_lapidus(lapidus_factory, pg_db, url, plugin)
        assert len(watcher.wait_count(3)) == 3
    finally:
        watcher.close()


@pytest.mark.parametrize("jetstream", [False, True])
def test_a_publish_the_server_refuses_fails_the_batch(private_nats, tmp_path, jetstream):
    """Core NATS has no ack: a subject the user may not publish to shows only as an -ERR.
    The batch must fail (and be sent again), never be confirmed with a change missing."""
    (tmp_path / "perm.conf").write_text(
        'authorization { users = [ { user: lap, password: "%s", permissions: {'
        ' publish: { allow: ["cdc.public.>", "_INBOX.>", "$JS.API.>"] },'
        ' subscribe: { allow: [">"] } } } ] }\n' % SECRET)
    private_nats.start("-c", str(tmp_path / "perm.conf"))

    def record(n: int, schema: str) -> Record:
        return Record(f"shop:0/1:{n}", "insert", schema, "t", (str(n),), "0/1", b"{}")

    async def run():
        options = {"servers": [private_nats.url], "user": "lap", "password": SECRET,
                   "subject_prefix": "cdc"}
        if jetstream:
            options.update(jetstream=True, stream="PERM", subjects=["cdc.>"], ack_timeout=1)
        sink = NatsSink(options, "shop")
        await sink.start()
        try:
            await asyncio.wait_for(sink.send([record(1, "public")]), 20)     # allowed
            with pytest.raises(SinkError) as info:
                await asyncio.wait_for(sink.send(
                    [record(2, "public"), record(3, "billing"), record(4, "public")]), 20)
            return str(info.value)
        finally:
            await sink.close()

    message = asyncio.run(run())
    assert 'permissions violation for publish to "cdc.billing.t.3"' in message.lower()
    assert "may not publish to that subject" in message and SECRET not in message
