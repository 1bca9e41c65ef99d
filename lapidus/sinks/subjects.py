"""NATS subjects for events: ``[prefix.]schema.table.key`` with reversible tokens.

Runs in the dispatcher process, inside its asyncio loop (the nats sink calls
:meth:`SubjectBuilder.subject` once per record); pure and stdlib only, so consumers can import
:func:`decode_token` / :func:`decode_key` to turn a subject back into key values.

Token rules (docs/sinks.md, EVENTS.md "NATS subjects"):

* A key value, schema or table name becomes exactly one subject token.  ``.``, ``*``, ``>``,
  ``%``, whitespace and non-printable characters are percent-encoded as the upper-case hex of
  their UTF-8 bytes (``a.b@c.com`` -> ``a%2Eb@c%2Ecom``); every other character, non-ASCII
  letters included, stays as it is.
* Two tokens are reserved, so that decoding needs no knowledge of the table: ``_`` stands for
  "no key" (a table without a primary key, a truncate), hence a value that *is* ``_`` is written
  ``%5F``; and the empty string (an empty text key) is the lone ``%``, which percent-encoding
  never produces otherwise.
* Encoding is canonical: ``encode_token(decode_token(t)) == t`` for every token that
  ``decode_token`` accepts, and ``decode_token(encode_token(v)) == v`` for every string.

Which code points count as printable follows ``str.isprintable()`` of the running Python, so a
code point that a later Unicode version assigns may move from escaped to literal; assigned
characters are stable.
"""

from __future__ import annotations

import re
import string
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import orjson

from ..events import Record

#: the whole key part of a subject when the record has no key
NO_KEY = "_"
#: the token of an empty key value
EMPTY = "%"

# Characters that may need escaping: anything outside printable ASCII, plus the four ASCII
# characters NATS gives a meaning to (or that we use for escaping).  Most keys are plain
# numbers or identifiers, so this one regex search is the whole cost on the hot path.
_MAYBE_UNSAFE = re.compile(r"[.*>%]|[^\x21-\x7e]")
_ASCII_UNSAFE = frozenset(".*>%")
_ESCAPE_RE = re.compile(r"%([0-9A-F]{2})")

PLACEHOLDERS = ("backend", "schema", "table", "key", "type")
DEFAULT_TEMPLATE = "{schema}.{table}.{key}"


def _escape_char(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))


def _is_literal(ch: str) -> bool:
    if ch in _ASCII_UNSAFE:
        return False
    if "\x21" <= ch <= "\x7e":
        return True
    return ch > "\x7e" and ch.isprintable() and not ch.isspace()


def encode_token(value: str) -> str:
    """One subject token for ``value`` (a key value, schema or table name)."""
    if not value:
        return EMPTY
    if value == NO_KEY:
        return "%5F"
    if _MAYBE_UNSAFE.search(value) is None:
        return value
    return "".join(ch if _is_literal(ch) else _escape_char(ch) for ch in value)


def decode_token(token: str) -> str:
    """The value a token stands for.  ValueError for text that :func:`encode_token` never
    produces (``_``, lower-case or stray ``%`` escapes, a raw ``.`` ...)."""
    if token == EMPTY:
        return ""
    if token == NO_KEY:
        raise ValueError('"_" stands for "no key", not for a value (see decode_key)')
    out: List[str] = []
    run = bytearray()     # consecutive escapes: one multi-byte UTF-8 character needs them all
    pos, size = 0, len(token)
    while pos < size:
        ch = token[pos]
        if ch == "%":
            match = _ESCAPE_RE.match(token, pos)
            if match is None:
                raise ValueError(f"token {token!r}: \"%\" must be followed by two upper-case "
                                 f"hex digits")
            run.append(int(match.group(1), 16))
            pos += 3
            continue
        if run:
            out.append(_utf8(run, token))
            run = bytearray()
        out.append(ch)
        pos += 1
    if run:
        out.append(_utf8(run, token))
    value = "".join(out)
    if encode_token(value) != token:
        raise ValueError(f"token {token!r} is not in canonical form "
                         f"(the encoding of its value is {encode_token(value)!r})")
    return value


def _utf8(data: bytearray, token: str) -> str:
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise ValueError(f"token {token!r}: its escapes are not valid UTF-8") from None


def encode_key(key: Optional[Sequence[str]]) -> str:
    """The key part of a subject: one token per key column in key order, ``_`` for none."""
    if key is None:
        return NO_KEY
    if len(key) == 1:
        return encode_token(key[0])
    return ".".join([encode_token(v) for v in key])


def decode_key(tokens: Sequence[str]) -> Optional[Tuple[str, ...]]:
    """Inverse of :func:`encode_key` given its tokens (``subject.split(".")[-n:]``)."""
    if list(tokens) == [NO_KEY]:
        return None
    return tuple(decode_token(t) for t in tokens)


# --------------------------------------------------------------------------------------------
# Whole subjects


def check_subject_part(text: str, *, allow_empty: bool = False) -> Optional[str]:
    """Why ``text`` cannot be a (part of a) literal NATS subject, or None when it can."""
    if not text:
        return None if allow_empty else "is empty"
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        return "contains whitespace or a control character"
    if "*" in text or ">" in text:
        return 'contains a wildcard ("*" or ">"), which cannot be published to'
    if text.startswith(".") or text.endswith(".") or ".." in text:
        return 'has an empty token (a leading or trailing ".", or "..")'
    return None


def placeholders_problem(template: str, known: Sequence[str]) -> Optional[str]:
    """Why ``template`` is not a ``str.format`` template over the plain placeholders
    ``known`` (``{schema}``, no format spec, no conversion), or None.  Shared by the
    templates of the sinks (a nats subject, a redis stream name)."""
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"is not a valid template: {exc} (write {{{{ and }}}} for literal braces)"
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in known:
            return (f"has an unknown placeholder {{{name}}} (known: "
                    + ", ".join(f"{{{p}}}" for p in known) + ")")
        if spec or conversion:
            return f"placeholder {{{name}}} takes no format spec or conversion"
    return None


def check_template(template: str) -> Optional[str]:
    """Why ``template`` is not a usable ``subject_template``, or None."""
    problem = placeholders_problem(template, PLACEHOLDERS)
    if problem:
        return problem
    fields = list(string.Formatter().parse(template))
    if sum(1 for _, name, _, _ in fields if name == "key") > 1:
        return "uses {key} more than once; it may appear at most once"
    sample = template.format(**{p: "x" for p in PLACEHOLDERS})
    problem = check_subject_part(sample)
    return f"gives subjects that are not valid: it {problem}" if problem else None


class SubjectBuilder:
    """Turns records into subjects; caches everything that depends only on (schema, table).

    * ``prefix``: prepended with a ``.`` (``"cdc"`` -> ``cdc.public.items.2``); may hold dots.
    * ``template``: placeholders ``{backend}``, ``{schema}``, ``{table}``, ``{key}``, ``{type}``,
      each replaced by encoded tokens (``{key}`` by one token per key column).
    * Records without a table: ``[prefix.]_message.<message prefix>`` for PostgreSQL logical
      messages; ``[prefix.]_<type>.<schema>`` for the rest (database-level schema events, gap
      events), ``_`` standing in for a missing schema.  The template does not apply to them.

    Both arguments must have passed :func:`check_subject_part` / :func:`check_template`.
    """

    def __init__(self, backend: str, prefix: str = "", template: Optional[str] = None):
        self.backend = backend
        self.prefix = f"{prefix}." if prefix else ""
        template = template or DEFAULT_TEMPLATE
        self._by_type = "{type}" in template
        # Split at {key} once: the hot path is then head + key tokens + tail.
        head, sep, tail = template.partition("{key}")
        self._has_key = bool(sep)
        self._head_template = head
        self._tail_template = tail
        self._cache: Dict[tuple, Tuple[str, str]] = {}

    def _parts(self, schema: str, table: str, kind: str) -> Tuple[str, str]:
        values = {"backend": encode_token(self.backend), "schema": encode_token(schema),
                  "table": encode_token(table), "type": encode_token(kind)}
        head = self.prefix + self._head_template.format(**values)
        tail = self._tail_template.format(**values)
        return head, tail

    def subject(self, record: Record) -> str:
        table = record.table
        if table is None:
            return self._tableless(record)
        if self._by_type:
            cache_key: tuple = (record.schema, table, record.type)
        else:
            cache_key = (record.schema, table)
        parts = self._cache.get(cache_key)
        if parts is None:
            parts = self._parts(record.schema or "", table, record.type)
            self._cache[cache_key] = parts
        if not self._has_key:
            return parts[0]
        key = record.key
        if key is not None and len(key) == 1 and key[0].isdigit():
            # The usual integer key: digits are always their own token (the hot path).
            return parts[0] + key[0] + parts[1]
        return parts[0] + encode_key(key) + parts[1]

    def _tableless(self, record: Record) -> str:
        if record.type == "message":
            # Rare (pg_logical_emit_message): parsing the payload for its prefix is fine here.
            prefix = orjson.loads(record.data).get("prefix")
            return f"{self.prefix}_message.{encode_token(prefix or '')}"
        schema = encode_token(record.schema) if record.schema is not None else NO_KEY
        return f"{self.prefix}_{encode_token(record.type)}.{schema}"


def subject_tokens(subject: str) -> List[str]:
    """A subject split into tokens (tokens never contain a raw ``.``)."""
    return subject.split(".")


RowSubject = Tuple[str, str, Optional[Tuple[str, ...]]]


def decoder_for(builder_prefix: str = "") -> Callable[[str], RowSubject]:
    """A function ``subject -> (schema, table, key)`` for subjects of the default template
    with the given prefix; raises ValueError for other subjects."""
    skip = len(builder_prefix.split(".")) if builder_prefix else 0

    def decode(subject: str) -> RowSubject:
        tokens = subject_tokens(subject)[skip:]
        if len(tokens) < 3:
            raise ValueError(f"{subject!r} is not a row subject")
        return decode_token(tokens[0]), decode_token(tokens[1]), decode_key(tokens[2:])

    return decode


__all__ = ("encode_token", "decode_token", "encode_key", "decode_key", "SubjectBuilder",
           "check_subject_part", "check_template", "decoder_for", "NO_KEY", "EMPTY",
           "DEFAULT_TEMPLATE", "PLACEHOLDERS")
