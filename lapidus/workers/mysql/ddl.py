"""What a binlog QueryEvent is: transaction control, a statement to stream, or one to skip.

Pure functions; runs in the mysql worker process.  With binlog_format=ROW the only statements
in the binlog are transaction control (BEGIN, COMMIT, SAVEPOINT ...), DDL and account
management.  DDL becomes a ``schema`` event (``TRUNCATE`` a ``truncate`` event) naming the
table it touches, so table filters apply to it too.  Account management (``GRANT``,
``CREATE USER``, ``SET PASSWORD`` ...) is skipped: it changes no table and its text can carry
password hashes, which must not leave the database.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional

CONTROL = "control"
COMMIT = "commit"
SKIP = "skip"
SCHEMA = "schema"
TRUNCATE = "truncate"

_COMMENTS = re.compile(r"^(?:\s+|/\*.*?\*/|#[^\n]*\n|--\s[^\n]*\n)*", re.S)
_IDENT = r"(?:`(?:[^`]|``)+`|[\w$]+)"
_NAME = rf"(?P<first>{_IDENT})(?:\s*\.\s*(?P<second>{_IDENT}))?"

_CONTROL_WORDS = ("BEGIN", "XA ", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO")
_COMMIT_WORDS = ("COMMIT", "ROLLBACK")
_ACCOUNT = re.compile(
    r"(?:GRANT|REVOKE|SET\s+PASSWORD|SET\s+DEFAULT\s+ROLE|(?:CREATE|ALTER|DROP|RENAME)\s+"
    r"(?:OR\s+REPLACE\s+)?(?:USER|ROLE))\b", re.I)

# Statement shapes whose target object can be named; the first match wins.
_TARGETS = (
    (TRUNCATE, re.compile(rf"TRUNCATE\s+(?:TABLE\s+)?{_NAME}", re.I)),
    (SCHEMA, re.compile(
        rf"(?:CREATE|ALTER|DROP)\s+(?:OR\s+REPLACE\s+)?(?:DATABASE|SCHEMA)\s+"
        rf"(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(?P<database>{_IDENT})", re.I)),
    (SCHEMA, re.compile(
        rf"(?:CREATE|DROP)\s+(?:OR\s+REPLACE\s+)?(?:ONLINE\s+|OFFLINE\s+)?(?:UNIQUE\s+|FULLTEXT\s+|"
        rf"SPATIAL\s+)?INDEX\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?{_IDENT}\s+(?:USING\s+\w+\s+)?"
        rf"ON\s+{_NAME}", re.I)),
    (SCHEMA, re.compile(
        rf"(?:CREATE|ALTER|DROP|RENAME)\s+(?:OR\s+REPLACE\s+)?(?:ONLINE\s+)?(?:IGNORE\s+)?"
        rf"(?:TEMPORARY\s+)?(?:TABLES?|VIEW|SEQUENCE|TRIGGER|PROCEDURE|FUNCTION|EVENT)\s+"
        rf"(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(?:/\*.*?\*/\s*)?{_NAME}", re.I | re.S)),
    (SCHEMA, re.compile(
        rf"CREATE\s+(?:OR\s+REPLACE\s+)?(?:DEFINER\s*=\s*\S+\s+)?(?:SQL\s+SECURITY\s+\w+\s+)?"
        rf"(?:ALGORITHM\s*=\s*\w+\s+)?(?:VIEW|TRIGGER|PROCEDURE|FUNCTION|EVENT)\s+"
        rf"(?:IF\s+NOT\s+EXISTS\s+)?{_NAME}", re.I)),
)


class Statement(NamedTuple):
    """A classified QueryEvent.  ``schema``/``table`` are None when not named in the text."""

    kind: str                 # CONTROL, COMMIT, SKIP, SCHEMA or TRUNCATE
    schema: Optional[str]
    table: Optional[str]


def unquote(identifier: str) -> str:
    if identifier.startswith("`") and identifier.endswith("`"):
        return identifier[1:-1].replace("``", "`")
    return identifier


def classify(sql: str, current_schema: Optional[str]) -> Statement:
    """Classify ``sql`` run with ``current_schema`` as the session's default database."""
    body = _COMMENTS.sub("", sql, count=1)
    head = body[:24].upper()
    if head.startswith(_CONTROL_WORDS):
        return Statement(CONTROL, None, None)
    if head.startswith(_COMMIT_WORDS) and not head.startswith("ROLLBACK TO"):
        return Statement(COMMIT, None, None)
    if _ACCOUNT.match(body):
        return Statement(SKIP, None, None)
    for kind, pattern in _TARGETS:
        match = pattern.match(body)
        if not match:
            continue
        groups = match.groupdict()
        if groups.get("database"):
            return Statement(kind, unquote(groups["database"]), None)
        first, second = groups.get("first"), groups.get("second")
        if second:
            return Statement(kind, unquote(first), unquote(second))
        return Statement(kind, current_schema or None, unquote(first))
    return Statement(SCHEMA, current_schema or None, None)
