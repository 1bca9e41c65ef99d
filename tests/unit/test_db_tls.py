"""TLS settings of the SQL backends, without a server: the file checks, the MySQL context and
how TLS failures are judged (FATAL, with the setting and the fix)."""

from __future__ import annotations

import ssl

import pymysql
import pytest

from lapidus.workers.base import BackendError
from lapidus.workers.mysql.connection import describe_error
from lapidus.workers.mysql.settings import settings_from
from lapidus.workers.mysql.tls import client_context
from lapidus.workers.postgresql.errors import child_error, connection_error
from lapidus.workers.postgresql.recvlogical import conninfo
from lapidus.workers.postgresql.tls import tls_options
from lapidus.workers.tls_files import check_files

PG = {"host": "db", "port": 5432, "user": "u", "database": "shop", "sslmode": "verify-full"}


def test_missing_and_unusable_files_name_the_setting(tmp_path):
    with pytest.raises(BackendError) as caught:
        check_files("b", {"sslcert": str(tmp_path / "no.pem")}, ("sslrootcert", "sslcert"))
    assert caught.value.fatal and f"sslcert file {tmp_path / 'no.pem'} does not exist" in \
        str(caught.value)
    with pytest.raises(BackendError, match="is a directory"):
        check_files("b", {"ssl_ca": str(tmp_path)}, ("ssl_ca",))
    (tmp_path / "ok.pem").write_text("x")
    check_files("b", {"ssl_ca": str(tmp_path / "ok.pem"), "ssl_cert": None}, ("ssl_ca", "ssl_cert"))


def test_pg_tls_options_reach_conninfo_for_pg_recvlogical(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    options = dict(PG, sslrootcert=str(ca), password="secret")
    assert tls_options(options, "b") == {"sslmode": "verify-full", "sslrootcert": str(ca)}
    text = conninfo(options, "lapidus")
    assert f"sslrootcert='{ca}'" in text and "sslmode='verify-full'" in text
    assert "secret" not in text


@pytest.mark.parametrize("libpq, expected", [
    ("connection to server at \"db\" failed: server does not support SSL, but SSL was required",
     "does not offer TLS, which sslmode=verify-full requires"),
    ("connection to server at \"db\" failed: SSL error: certificate verify failed",
     "is not trusted (SSL error: certificate verify failed); set sslrootcert"),
    ('connection to server at "db" failed: server certificate for "x" does not match host name '
     '"db"', 'sslmode = "verify-ca"'),
    ('private key file "/k" has group or world access; file must have permissions u=rw (0600)',
     "the key must be mode 0600"),
])
def test_pg_tls_failures_are_fatal_with_the_fix(libpq, expected):
    error = connection_error(Exception(libpq), PG, "b")
    assert error.fatal and expected in str(error) and "retrying" not in str(error)
    assert child_error(f"pg_recvlogical: error: {libpq}", PG, "b").fatal


def test_mysql_without_tls_settings_keeps_the_driver_default():
    assert client_context(settings_from("b", {})) is None
    assert "ssl" not in settings_from("b", {}).connection_kwargs()


def test_mysql_verification_modes():
    identity = client_context(settings_from("b", {"ssl_verify": "identity"}))
    assert identity.check_hostname and identity.verify_mode == ssl.CERT_REQUIRED
    ca = client_context(settings_from("b", {"ssl_verify": "ca"}))
    assert not ca.check_hostname and ca.verify_mode == ssl.CERT_REQUIRED
    none = client_context(settings_from("b", {"ssl_verify": "none"}))
    assert none.verify_mode == ssl.CERT_NONE
    assert isinstance(settings_from("b", {"ssl_verify": "none"}).connection_kwargs()["ssl"],
                      ssl.SSLContext)


def test_mysql_unusable_files_are_fatal(tmp_path):
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(BackendError, match="ssl_ca file .* holds no usable CA") as caught:
        client_context(settings_from("b", {"ssl_ca": str(garbage)}))
    assert caught.value.fatal
    with pytest.raises(BackendError, match="ssl_key is set without ssl_cert"):
        client_context(settings_from("b", {"ssl_key": str(garbage)}))
    with pytest.raises(BackendError, match="ssl_cert/ssl_key cannot be used"):
        client_context(settings_from("b", {"ssl_cert": str(garbage)}))


def _connect_error(original: BaseException) -> pymysql.err.OperationalError:
    exc = pymysql.err.OperationalError(2003, f"Can't connect to MySQL server on 'db' ({original})")
    exc.original_exception = original
    return exc


def test_mysql_tls_failures_are_fatal_with_the_fix():
    s = settings_from("b", {"host": "db", "ssl_verify": "identity"})
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    untrusted.verify_message = "unable to get local issuer certificate"
    error = describe_error(s, _connect_error(untrusted))
    assert error.fatal and "is not trusted" in str(error) and "set ssl_ca" in str(error)
    mismatch = ssl.SSLCertVerificationError(1, "certificate verify failed")
    mismatch.verify_message = "Hostname mismatch, certificate is not valid for 'db'."
    assert 'ssl_verify = "ca"' in str(describe_error(s, _connect_error(mismatch)))
    plain = pymysql.err.OperationalError(2026, "SSL is required but the server doesn't support it")
    error = describe_error(s, plain)
    assert error.fatal and "does not offer TLS" in str(error)
    # a refused connection stays transient
    refused = describe_error(s, _connect_error(ConnectionRefusedError(111, "refused")))
    assert not refused.fatal
