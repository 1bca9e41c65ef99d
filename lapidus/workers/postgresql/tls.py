"""The libpq TLS parameters of a PostgreSQL backend, for psycopg2 and for pg_recvlogical.

Runs in the PostgreSQL worker process.  One place builds them so that the worker's own
connections (:mod:`.catalog`) and the ``pg_recvlogical`` child (:mod:`.recvlogical`) can never
disagree about TLS: a child that silently connected in plain text while the checks ran over
TLS would defeat the setting.
"""

from __future__ import annotations

from typing import Dict, Optional

from ..tls_files import check_files

KEYS = ("sslmode", "sslrootcert", "sslcert", "sslkey")
FILES = ("sslrootcert", "sslcert", "sslkey")


def tls_options(options: dict, backend: Optional[str]) -> Dict[str, str]:
    """The TLS keys set in ``options``.  With ``backend``, the files are checked first: a
    missing or unreadable one is a fatal :class:`~lapidus.workers.base.BackendError` naming
    the setting (libpq would skip a missing client certificate without a word)."""
    if backend is not None:
        check_files(backend, options, FILES)
    return {key: str(options[key]) for key in KEYS if options.get(key)}
