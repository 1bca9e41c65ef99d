"""A snapshot chunk's rows, from PostgreSQL's text form to ``(pk, item)``, column by column.

Runs in the PostgreSQL worker process, once per chunk (:meth:`.snapshot.PgSnapshot.start_chunk`).
The values are exactly those of the decoders: each column goes through its type's converter
(:mod:`.types`), NULL stays ``None``.  What this module adds is *how*: the chunk is turned
into columns (one C-level transpose), a column whose converter is the identity for text
(``text``, ``varchar``, ``numeric``, enums ...) is not touched at all, the others are mapped
in one pass each, and the rows' dicts are built from the columns without a Python-level loop
per value.  Per value, only the converters that do something are called.

:func:`chunk_lines` goes one step further for the worker loop: each row becomes its ``read``
event's JSON line right away, from JSON texts made column by column (no dict, no event
object per row), byte for byte what :func:`lapidus.events.encode` gives for the event that
:func:`chunk_rows`'s row would make.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...events import encode_value, key_values
from ..snapshot.events import pk_text
from .types import to_int, to_numeric, to_text, to_timestamptz

#: converters that return their text input unchanged (to_numeric: a ``str`` is its exact
#: digits; the snapshot hands converters only ``str``)
IDENTITY_FOR_TEXT = frozenset({to_text, to_numeric})


def _timestamptz_column(column: Sequence[Any]) -> List[Any]:
    """:func:`.types.to_timestamptz` over a column, its fast path (UTC, ISO: what the
    snapshot's session produces) inline instead of a call per value; the same test, so the
    same results, and anything else still goes through the converter itself."""
    return [None if value is None
            else value[:-3].replace(" ", "T") + "Z" if value[-3:] == "+00" and value[4:5] == "-"
            else to_timestamptz(value) for value in column]


#: converter -> the same conversion over a whole column (NULLs included), where that saves
#: a Python call per value
COLUMN_CONVERTERS: Dict[Callable[[Any], Any], Callable[[Sequence[Any]], List[Any]]] = {
    to_timestamptz: _timestamptz_column,
}


def convert_columns(raw: Sequence[Sequence[Any]],
                    converters: Sequence[Callable[[Any], Any]]) -> List[Sequence[Any]]:
    """The chunk's columns (``raw`` is its rows of text or ``None``), each converted."""
    columns: List[Sequence[Any]] = list(zip(*raw))
    for index, convert in enumerate(converters):
        if convert in IDENTITY_FOR_TEXT:
            continue
        column = columns[index]
        whole = COLUMN_CONVERTERS.get(convert)
        if whole is not None:
            columns[index] = whole(column)
        elif None in column:
            columns[index] = [None if value is None else convert(value) for value in column]
        else:
            columns[index] = list(map(convert, column))
    return columns


def chunk_rows(raw: Sequence[Sequence[Any]], names: Sequence[str],
               converters: Sequence[Callable[[Any], Any]],
               key_index: Sequence[int]) -> List[Tuple[str, Tuple[Dict[str, Any], Dict[str, Any]]]]:
    """``(pk text, (pk, item))`` per row of ``raw``, in its order: ``item`` the whole row by
    column name, ``pk`` the key columns (``key_index`` into ``names``, in key order), ``pk
    text`` :func:`..snapshot.events.pk_text` of the key values (what
    :meth:`..snapshot.window.ChunkWindow.hold_keyed` keys the rows by)."""
    if not raw:
        return []
    int_key = len(key_index) == 1 and converters[key_index[0]] is to_int
    return _builder(tuple(names), tuple(key_index), int_key)(convert_columns(raw, converters))


@lru_cache(maxsize=256)
def _builder(names: Tuple[str, ...], key_index: Tuple[int, ...], int_key: bool):
    """A function of the converted columns that builds the rows in one comprehension, the
    column names written into it as constants: ``[("[" + str(v0) + "]", ({"id": v0},
    {"id": v0, "name": v1})) for v0, v1 in zip(*columns)]``.

    Why generated code: a dict display with constant keys is built by one opcode, several
    times faster than ``dict(zip(names, row))`` (figures in docs/dev/benchmarks.md, Snapshot).
    The names are inserted with ``repr``, which writes any string as the literal of exactly
    that string, so a column name cannot become code.  A one-column
    key converted by ``int`` (a key column is never NULL) has the text ``[<int>]``, which
    is what :func:`pk_text` gives for it; any other key calls :func:`pk_text`.  Cached per
    table shape, in the worker process.
    """
    values = [f"v{index}" for index in range(len(names))]
    item = ", ".join(f"{name!r}: {value}" for name, value in zip(names, values))
    pk = ", ".join(f"{names[index]!r}: {values[index]}" for index in key_index)
    if int_key:
        text = f'"[" + str({values[key_index[0]]}) + "]"'
    else:
        text = f"pk_text(({''.join(values[index] + ', ' for index in key_index)}))"
    source = (f"def build(columns):\n"
              f"    return [({text}, ({{{pk}}}, {{{item}}}))\n"
              f"            for {', '.join(values)}, in zip(*columns)]\n")
    namespace: Dict[str, Any] = {"pk_text": pk_text}
    exec(compile(source, f"<chunk rows of {len(names)} columns>", "exec"), namespace)
    return namespace["build"]


# -- rows straight to JSON lines ----------------------------------------------------------------

#: the characters orjson writes escaped in a string (everything else it copies as UTF-8)
_ESCAPED = re.compile(r'["\\\x00-\x1f]')


def _json(value: Any) -> str:
    return encode_value(value).decode()


#: a value's place in a row's ``%`` template: its JSON text as given, or a string that the
#: template quotes (a column of strings without a character to escape: no new string per value)
AS_GIVEN, QUOTED = "%s", '"%s"'


def _json_strings(values: Sequence[Optional[str]]) -> Optional[Tuple[Sequence[str], str]]:
    """A column of strings (None for NULL) as ``(texts, place)`` (see :func:`json_column`);
    None when a value is not a string.  Such a column without a character to escape and
    without NULL (nearly all) is given as it is, for the template to quote: what orjson
    writes for such a string."""
    present = values if None not in values else [v for v in values if v is not None]
    try:
        joined = "".join(present)
    except TypeError:
        return None
    if _ESCAPED.search(joined):
        return ["null" if v is None else _json(v) for v in values], AS_GIVEN
    if present is values:
        return values, QUOTED
    return ["null" if v is None else '"' + v + '"' for v in values], AS_GIVEN


def json_column(column: Sequence[Optional[str]],
                convert: Callable[[Any], Any]) -> Tuple[Sequence[str], str]:
    """One column of a chunk (PostgreSQL's text, None for NULL) as ``(texts, place)``: with
    ``place`` (:data:`AS_GIVEN` or :data:`QUOTED`) around it, each text is exactly orjson's
    encoding of the value that ``convert`` gives, ``null`` for NULL."""
    if convert is to_int:
        # int2, int4, int8, oid: PostgreSQL writes plain decimal integers, the JSON numbers
        if None in column:
            return ["null" if v is None else v for v in column], AS_GIVEN
        return column, AS_GIVEN
    if convert in IDENTITY_FOR_TEXT:
        strings = _json_strings(column)
        if strings is not None:
            return strings
    whole = COLUMN_CONVERTERS.get(convert)
    converted = (whole(column) if whole is not None
                 else [None if v is None else convert(v) for v in column])
    strings = _json_strings(converted)
    if strings is not None:
        return strings
    return ["null" if v is None else _json(v) for v in converted], AS_GIVEN


def _template(text: str) -> str:
    """``text`` as a constant part of a ``%`` template."""
    return text.replace("%", "%%")


def chunk_lines(raw: Sequence[Sequence[Any]], names: Sequence[str],
                converters: Sequence[Callable[[Any], Any]], key_index: Sequence[int],
                id_head: str, head: str, middle: str) -> List[Tuple[str, Tuple[str, tuple, str]]]:
    """``(pk text, (event id, record key, line))`` per row of ``raw``, in its order.

    ``pk text`` is :func:`chunk_rows`'s (the window's key), the event id ``id_head + pk text``,
    the record key :func:`lapidus.events.key_values` of the row's key, and ``line`` the event's
    JSON without its tail: ``{"id":<id>`` + ``head`` + the pk's JSON + ``middle`` + the item's
    JSON, where ``head`` and ``middle`` are :func:`lapidus.events.read_pieces`' for the
    chunk's table.  Appending the pieces' tail (the members after ``item``, which hold the
    position and time known only at the high watermark) gives :func:`lapidus.events.encode`'s
    bytes for the event of :func:`chunk_rows`'s row (tests/unit/test_pg_chunk_rows.py).
    """
    if not raw:
        return []
    columns = list(zip(*raw))
    texts, places = zip(*(json_column(column, convert)
                          for column, convert in zip(columns, converters)))
    item = "{" + ",".join(_template(_json(name)) + ":" + place
                          for name, place in zip(names, places)) + "}"
    if len(key_index) == 1 and converters[key_index[0]] is to_int:
        # the common key, one integer column: its text is the JSON number, its pk text
        # "[<n>]", which needs no escaping inside the id
        index = key_index[0]
        line = ('{"id":"' + _template(_json(id_head)[1:-1]) + '%s"' + _template(head)
                + "{" + _template(_json(names[index])) + ":%s}" + _template(middle) + item)
        return [(text, (id_head + text, (key,), line % ((text, key) + values)))
                for key, values in zip(columns[index], zip(*texts))
                for text in ("[" + key + "]",)]
    keys = [[None if v is None else converters[i](v) for v in columns[i]] for i in key_index]
    key_names = [names[i] for i in key_index]
    pk = "{" + ",".join(_template(_json(names[i])) + ":" + places[i] for i in key_index) + "}"
    out = []
    for values, key in zip(zip(*texts), zip(*keys)):
        text = pk_text(key)
        event_id = id_head + text
        out.append((text, (event_id, key_values(dict(zip(key_names, key))),
                           '{"id":' + _json(event_id) + head
                           + pk % tuple(values[i] for i in key_index) + middle + item % values)))
    return out
