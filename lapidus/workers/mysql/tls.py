"""TLS for MySQL/MariaDB connections: the ``ssl.SSLContext`` both connections use.

Runs in the mysql worker process.  The same context goes to the query connection and, through
python-mysql-replication's connection settings, to the binlog stream (and the library's own
control connection, which copies them).  Passing a context (not pymysql's ``ssl_*`` keywords)
makes TLS *required*: pymysql then refuses a server that does not offer it (error 2026)
instead of falling back to plain text, which its keywords do for ``verify = none``.
"""

from __future__ import annotations

import ssl
from typing import Optional

from ..base import BackendError
from ..tls_files import check_files

FILES = ("ssl_ca", "ssl_cert", "ssl_key")


_PREFERRED: Optional[ssl.SSLContext] = None


def preferred_context() -> ssl.SSLContext:
    """The context of pymysql's *preferred* TLS (no TLS settings: encrypt when the server
    offers it, verify nothing), one per process.

    pymysql builds a new default context for every connection, which loads the system's CA
    store (about a megabyte each) that this mode never consults."""
    global _PREFERRED
    if _PREFERRED is None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        _PREFERRED = ctx
    return _PREFERRED


def wanted(settings) -> bool:
    """Whether the settings ask for TLS at all."""
    return bool(settings.ssl_verify or settings.ssl_ca or settings.ssl_cert or settings.ssl_key)


def client_context(settings) -> Optional[ssl.SSLContext]:
    """The context for ``settings`` (a :class:`MysqlSettings`), or None when TLS is not asked
    for (pymysql's default applies).  A file that is missing or not PEM is a fatal
    :class:`BackendError` naming the setting."""
    if not wanted(settings):
        return None
    who = f'backend "{settings.name}"'
    if settings.ssl_key and not settings.ssl_cert:
        raise BackendError(f"{who}: ssl_key is set without ssl_cert; set ssl_cert to the client "
                           f"certificate that goes with the key (or remove ssl_key)", fatal=True)
    check_files(settings.name, {k: getattr(settings, k) for k in FILES}, FILES)
    verify = settings.ssl_verify or "identity"
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if settings.ssl_ca:
        try:
            ctx.load_verify_locations(cafile=settings.ssl_ca)
        except ssl.SSLError as exc:
            raise BackendError(f"{who}: ssl_ca file {settings.ssl_ca} holds no usable CA "
                               f"certificate ({exc.reason or exc}); it must be PEM "
                               f"(-----BEGIN CERTIFICATE-----)", fatal=True) from None
    if settings.ssl_cert:
        try:
            ctx.load_cert_chain(settings.ssl_cert, keyfile=settings.ssl_key or None)
        except ssl.SSLError as exc:
            raise BackendError(f"{who}: ssl_cert/ssl_key cannot be used ({exc.reason or exc}); "
                               f"both must be PEM, the key unencrypted and belonging to the "
                               f"certificate (without ssl_key, ssl_cert must hold the key too)",
                               fatal=True) from None
    # Self-signed server certificates (MySQL's auto-generated ones) fail Python's strict
    # X.509 checks although they are trusted explicitly through ssl_ca.
    ctx.verify_flags &= ~getattr(ssl, "VERIFY_X509_STRICT", 0)
    ctx.check_hostname = verify == "identity"
    ctx.verify_mode = ssl.CERT_NONE if verify == "none" else ssl.CERT_REQUIRED
    return ctx


def describe_tls_failure(settings, exc: BaseException) -> Optional[BackendError]:
    """A fatal error for a failed TLS handshake or a server without TLS, else None.

    Retrying cannot help: the server's certificate does not change by itself."""
    who, where = f'backend "{settings.name}"', f"{settings.host}:{settings.port}"
    original = getattr(exc, "original_exception", None)
    if isinstance(original, ssl.SSLCertVerificationError):
        reason = original.verify_message or str(original)
        if "hostname" in reason.lower() or "ip address mismatch" in reason.lower():
            fix = ("connect with the host name the certificate names, or set "
                   'ssl_verify = "ca" to check the chain only')
        else:
            fix = ("set ssl_ca to the CA that signed the server's certificate "
                   "(SHOW VARIABLES LIKE 'ssl_cert' on the server shows its file)")
        return BackendError(f"{who}: the TLS certificate of MySQL/MariaDB at {where} is not "
                            f"trusted ({reason}); {fix}", fatal=True)
    if isinstance(original, ssl.SSLError):
        return BackendError(f"{who}: the TLS handshake with MySQL/MariaDB at {where} failed "
                            f"({original.reason or original}); check the server's TLS "
                            f"configuration and the backend's ssl_* settings", fatal=True)
    if "SSL is required but the server doesn't support it" in str(exc):
        return BackendError(f"{who}: MySQL/MariaDB at {where} does not offer TLS, which the "
                            f"backend's ssl_* settings require; enable TLS on the server "
                            f"(ssl_cert and ssl_key in its option files, SHOW VARIABLES LIKE "
                            f"'have_ssl' must say YES) or remove the ssl_* settings", fatal=True)
    return None
