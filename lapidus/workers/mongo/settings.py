"""A mongo backend's options, validated, and the pymongo client they describe.

Runs in the mongo worker process, after fork (the options are plain data, so building the
settings anywhere is harmless; the client is only created by :func:`create_client`).

Options arrive from :class:`lapidus.config.BackendConfig` as a dict with snake_case keys (the
loader has already turned the original Lapidus's ``hostname``/``username``/``replicaSet`` into
``host``/``user``/``replica_set``).  Every key is optional:

``uri``                         a MongoDB connection string; the keys below override what it says
``host``, ``port``              default ``127.0.0.1`` and ``27017`` when there is no ``uri``
``user``, ``password``          SCRAM credentials
``auth_source``                 where the user was created; unset: the driver's default (``admin``,
                                or the database in the path of ``uri``)
``database``                    watch this database only; unset: the whole deployment (the database
                                in the path of ``uri`` is only the authentication default: it is
                                often ``admin``, which has no change stream)
``replica_set``                 the replica set name (``rs0``)
``tls``, ``tls_ca_file``, ``tls_certificate_key_file``, ``tls_allow_invalid_certificates``
``full_document``               ``updateLookup`` (default), ``whenAvailable``, ``required``
``full_document_before_change`` ``off`` (default), ``whenAvailable``, ``required``
``history_lost``                ``fail`` (default) or ``restart_from_now``
``batch_size``                  change-stream cursor batch size (server default when absent)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from bson.codec_options import DatetimeConversion

from ..base import BackendError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 27017

FULL_DOCUMENT_MODES = ("updateLookup", "whenAvailable", "required")
BEFORE_CHANGE_MODES = ("off", "whenAvailable", "required")
HISTORY_LOST_POLICIES = ("fail", "restart_from_now")

# How long pymongo looks for a usable server before an operation fails.  Its default (30 s) keeps
# a worker silent for half a minute when the server is down; 10 s still rides out an election.
SERVER_SELECTION_TIMEOUT_MS = 10_000
CONNECT_TIMEOUT_MS = 10_000

# user:password@ after any scheme (a mistyped "postgres://" URI must not leak either).
_URI_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:@/\s]*):[^@/\s]*@")


@dataclass(frozen=True)
class MongoSettings:
    """The validated options of one mongo backend (see the module docstring for each key)."""

    backend: str
    uri: Optional[str] = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    user: Optional[str] = None
    password: Optional[str] = None
    database: Optional[str] = None
    replica_set: Optional[str] = None
    auth_source: Optional[str] = None
    tls: Optional[bool] = None
    tls_ca_file: Optional[str] = None
    tls_certificate_key_file: Optional[str] = None
    tls_allow_invalid_certificates: Optional[bool] = None
    full_document: str = "updateLookup"
    full_document_before_change: str = "off"
    history_lost: str = "fail"
    batch_size: Optional[int] = None

    @classmethod
    def from_options(cls, backend: str, options: Mapping[str, Any]) -> "MongoSettings":
        """Validate ``options``; raises a fatal :class:`BackendError` listing every problem."""
        problems: List[str] = []

        def choice(key: str, allowed: Tuple[str, ...], default: str) -> str:
            value = options.get(key, default)
            if value is None:
                return default
            if value not in allowed:
                problems.append(f"{key} is {value!r}; expected one of "
                                + ", ".join(repr(a) for a in allowed))
                return default
            return value

        def text(key: str) -> Optional[str]:
            value = options.get(key)
            if value is None or value == "":
                return None
            if not isinstance(value, str):
                problems.append(f"{key} must be a string, not {type(value).__name__}")
                return None
            return value

        def flag(key: str) -> Optional[bool]:
            value = options.get(key)
            if value is None or isinstance(value, bool):
                return value
            problems.append(f"{key} must be true or false, not {value!r}")
            return None

        def positive_int(key: str, default: Optional[int]) -> Optional[int]:
            value = options.get(key, default)
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
                problems.append(f"{key} must be a positive integer, not {value!r}")
                return default
            return value

        settings = cls(
            backend=backend,
            uri=text("uri"),
            host=text("host") or DEFAULT_HOST,
            port=positive_int("port", DEFAULT_PORT) or DEFAULT_PORT,
            user=text("user"),
            password=text("password"),
            database=text("database"),
            replica_set=text("replica_set"),
            auth_source=text("auth_source"),
            tls=flag("tls"),
            tls_ca_file=text("tls_ca_file"),
            tls_certificate_key_file=text("tls_certificate_key_file"),
            tls_allow_invalid_certificates=flag("tls_allow_invalid_certificates"),
            full_document=choice("full_document", FULL_DOCUMENT_MODES, "updateLookup"),
            full_document_before_change=choice("full_document_before_change",
                                               BEFORE_CHANGE_MODES, "off"),
            history_lost=choice("history_lost", HISTORY_LOST_POLICIES, "fail"),
            batch_size=positive_int("batch_size", None),
        )
        if settings.uri is not None and not settings.uri.startswith(("mongodb://",
                                                                     "mongodb+srv://")):
            problems.append(f"uri {redact_uri(settings.uri)!r} must start with mongodb:// "
                            "or mongodb+srv://")
        if problems:
            raise BackendError(
                f'backend "{backend}": invalid mongo options: ' + "; ".join(problems)
                + "; fix them in the configuration file", fatal=True)
        return settings

    @property
    def where(self) -> str:
        """The server(s) for messages, never with a password: ``db1:27017`` or a redacted URI."""
        if self.uri is not None:
            return redact_uri(self.uri)
        return f"{self.host}:{self.port}"

    @property
    def effective_auth_source(self) -> Optional[str]:
        """The authentication database pymongo will use, for messages (``None``: the URI's)."""
        if self.auth_source:
            return self.auth_source
        return None if self.uri is not None else "admin"

    def client_arguments(self) -> Tuple[Any, Dict[str, Any]]:
        """``(host_or_uri, keyword arguments)`` for :class:`pymongo.MongoClient`.

        Explicit options win over the URI's own settings (pymongo applies keyword arguments on
        top of the connection string), so ``uri`` plus ``password = "${SECRET}"`` works.
        """
        kwargs: Dict[str, Any] = {
            "appname": "lapidus",
            "serverSelectionTimeoutMS": SERVER_SELECTION_TIMEOUT_MS,
            "connectTimeoutMS": CONNECT_TIMEOUT_MS,
            # Decoding choices the event mapping relies on (see bson_json): naive UTC datetimes,
            # and dates outside Python's range as DatetimeMS instead of an exception that would
            # stop the stream at that change forever.
            "tz_aware": False,
            "datetime_conversion": DatetimeConversion.DATETIME_AUTO,
        }
        if self.user is not None:
            kwargs["username"] = self.user
        if self.password is not None:
            kwargs["password"] = self.password
        if self.auth_source is not None:
            kwargs["authSource"] = self.auth_source
        if self.replica_set is not None:
            kwargs["replicaSet"] = self.replica_set
        tls_files = (self.tls_ca_file, self.tls_certificate_key_file,
                     self.tls_allow_invalid_certificates)
        if self.tls is not None:
            kwargs["tls"] = self.tls
        elif any(v is not None for v in tls_files):
            # A CA file or client certificate only means something over TLS.
            kwargs["tls"] = True
        if self.tls_ca_file is not None:
            kwargs["tlsCAFile"] = self.tls_ca_file
        if self.tls_certificate_key_file is not None:
            kwargs["tlsCertificateKeyFile"] = self.tls_certificate_key_file
        if self.tls_allow_invalid_certificates is not None:
            kwargs["tlsAllowInvalidCertificates"] = self.tls_allow_invalid_certificates
        if self.uri is not None:
            return self.uri, kwargs
        kwargs["port"] = self.port
        return self.host, kwargs

    def redact(self, text: str) -> str:
        """``text`` with the password (if any) replaced, for messages that quote pymongo."""
        text = _URI_PASSWORD.sub(r"\1:***@", text)
        if self.password:
            text = text.replace(self.password, "***")
        return text


def redact_uri(uri: str) -> str:
    """A connection string without its password: ``mongodb://lapidus:***@db1,db2/shop``."""
    return _URI_PASSWORD.sub(r"\1:***@", uri)


def create_client(settings: MongoSettings):
    """A new :class:`pymongo.MongoClient` (lazy: it connects on first use).

    Runs in the worker after fork: pymongo clients start monitor threads and must not cross a fork.
    """
    from pymongo import MongoClient

    target, kwargs = settings.client_arguments()
    return MongoClient(target, **kwargs)
