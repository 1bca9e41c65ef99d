"""A snapshot chunk's rows, from PostgreSQL's text form to ``(pk, item)``, column by column.

Runs in the PostgreSQL worker process, once per chunk (:meth:`.snapshot.PgSnapshot.start_chunk`).
The values are exactly those of the decoders: each column goes through its type's converter
(:mod:`.types`), NULL stays ``None``.  What this module adds is *how*: the chunk is turned
into columns (one C-level transpose), a column whose converter is the identity for text
(``text``, ``varchar``, ``numeric``, enums ...) is not touched at all, the others are mapped
in one pass each, and the rows' dicts are built from the columns without a Python-level loop
per value.  Per value, only the converters that do something are called.

:func:`chunk_columns` goes one step further for the worker loop: the chunk's columns as the
JSON texts of their values, from which :func:`..snapshot.lines.chunk_lines` makes each row's
``read`` event line without a dict or an event per row.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..snapshot.events import pk_text
from ..snapshot.lines import AS_GIVEN, Texts, json_strings, json_texts
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


def convert_column(column: Sequence[Any], convert: Callable[[Any], Any]) -> Sequence[Any]:
    """One column of a chunk (text or ``None``) converted; a column whose converter is the
    identity for text comes back as it is."""
    if convert in IDENTITY_FOR_TEXT:
        return column
    whole = COLUMN_CONVERTERS.get(convert)
    if whole is not None:
        return whole(column)
    if None in column:
        return [None if value is None else convert(value) for value in column]
    return list(map(convert, column))


def convert_columns(raw: Sequence[Sequence[Any]],
                    converters: Sequence[Callable[[Any], Any]]) -> List[Sequence[Any]]:
    """The chunk's columns (``raw`` is its rows of text or ``None``), each converted."""
    return [convert_column(column, convert) for column, convert in zip(zip(*raw), converters)]


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

def json_column(column: Sequence[Optional[str]], convert: Callable[[Any], Any]) -> Texts:
    """One column of a chunk (PostgreSQL's text, None for NULL) as
    :func:`..snapshot.lines.json_texts` of its converted values."""
    if convert is to_int:
        # int2, int4, int8, oid: PostgreSQL writes plain decimal integers, the JSON numbers
        if None in column:
            return ["null" if v is None else v for v in column], AS_GIVEN
        return column, AS_GIVEN
    if convert in IDENTITY_FOR_TEXT:
        return json_strings(column)       # never None: text or NULL only
    return json_texts(convert_column(column, convert))


def chunk_columns(raw: Sequence[Sequence[Any]], converters: Sequence[Callable[[Any], Any]],
                  key_index: Sequence[int]) -> Tuple[List[Texts], Optional[List[list]]]:
    """What :func:`..snapshot.lines.chunk_lines` takes for a chunk's rows of text: every
    column's JSON texts, and the key columns' converted values (None for one integer key
    column, whose texts are the key itself)."""
    columns = list(zip(*raw))
    texts = [json_column(column, convert) for column, convert in zip(columns, converters)]
    if len(key_index) == 1 and converters[key_index[0]] is to_int:
        return texts, None
    return texts, [convert_column(columns[i], converters[i]) for i in key_index]
