"""A snapshot chunk's rows straight to their ``read`` events' JSON lines, column by column.

Runs in the worker process, once per chunk, for a source whose run is ``encoded``
(:attr:`lapidus.workers.base.Source.encoded_reads`: the worker loop's).  The source hands its
chunk over as columns of event values (what its ``(pk, item)`` dicts would hold); each column
becomes the JSON texts of its values at C speed where it can (:func:`json_texts`), and each row
one ``%`` formatting of a template built once per chunk from the constant pieces of the
table's read events (:func:`lapidus.events.read_pieces`).  No dict, event or orjson call per
row; the result is byte for byte :func:`lapidus.events.encode`'s for the event the dicts would
make (tests/unit/test_pg_chunk_rows.py; tests/integration/test_mysql_snapshot.py).
"""

from __future__ import annotations

import re
from typing import Any, List, Optional, Sequence, Tuple

from ...events import encode_value, key_values
from .events import pk_text

#: the characters orjson writes escaped in a string (everything else it copies as UTF-8)
_ESCAPED = re.compile(r'["\\\x00-\x1f]')

#: a value's place in a row's ``%`` template: its JSON text as given, or a string that the
#: template quotes (a column of strings without a character to escape: no new string per value)
AS_GIVEN, QUOTED = "%s", '"%s"'

Texts = Tuple[Sequence[str], str]       # a column's JSON texts and their place


def _json(value: Any) -> str:
    return encode_value(value).decode()


def json_strings(values: Sequence[Optional[str]]) -> Optional[Texts]:
    """A column of strings (None for NULL) as ``(texts, place)`` (see :func:`json_texts`);
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


def json_texts(values: Sequence[Any]) -> Texts:
    """A column of event values as ``(texts, place)``: with ``place`` (:data:`AS_GIVEN` or
    :data:`QUOTED`) around it, each text is exactly orjson's encoding of the value, ``null``
    for None.

    Strings go through :func:`json_strings`.  A column of numbers, booleans and NULLs is
    encoded as one JSON array and cut at its commas (none of those texts holds one); anything
    else (arrays, objects, strings among other values) value by value."""
    strings = json_strings(values)
    if strings is not None:
        return strings
    inner = _json(list(values))[1:-1]
    if '"' not in inner and "[" not in inner and "{" not in inner:
        return inner.split(","), AS_GIVEN
    return ["null" if v is None else _json(v) for v in values], AS_GIVEN


def _constant(text: str) -> str:
    """``text`` as a constant part of a ``%`` template."""
    return text.replace("%", "%%")


def chunk_lines(columns: Sequence[Texts], names: Sequence[str], key_index: Sequence[int],
                keys: Optional[Sequence[Sequence[Any]]], id_head: str, head: str,
                middle: str) -> List[Tuple[str, Tuple[str, tuple, str]]]:
    """``(pk text, (event id, record key, line))`` per row, in the columns' order.

    ``columns``: every column's :func:`json_texts`; ``key_index`` the key columns in key order;
    ``keys`` the key columns' values (as :func:`json_texts` had them), or None when the key is
    one column of integers (its texts are then the key itself).  ``pk text`` is
    :func:`.events.pk_text` of the key, the event id ``id_head + pk text``, the record key
    :func:`lapidus.events.key_values`', and ``line`` the event's JSON without its tail:
    ``{"id":<id>`` + ``head`` + the pk's JSON + ``middle`` + the item's JSON (``head`` and
    ``middle`` from :func:`lapidus.events.read_pieces`).  The tail holds the position and time,
    known only when the chunk is emitted (:meth:`.run.SnapshotRun.emit_window`).
    """
    if not columns:
        return []
    texts, places = zip(*columns)
    item = "{" + ",".join(_constant(_json(name)) + ":" + place
                          for name, place in zip(names, places)) + "}"
    pk = "{" + ",".join(_constant(_json(names[i])) + ":" + places[i] for i in key_index) + "}"
    if keys is None:
        # one integer column: its text is the JSON number, the pk text "[<n>]", which
        # needs no escaping inside the id
        line = ('{"id":"' + _constant(_json(id_head)[1:-1]) + '%s"' + _constant(head) + pk
                + _constant(middle) + item)
        return [(text, (id_head + text, (key,), line % ((text, key) + values)))
                for key, values in zip(texts[key_index[0]], zip(*texts))
                for text in ("[" + key + "]",)]
    key_names = [names[i] for i in key_index]
    out = []
    for values, key in zip(zip(*texts), zip(*keys)):
        text = pk_text(key)
        event_id = id_head + text
        out.append((text, (event_id, key_values(dict(zip(key_names, key))),
                           '{"id":' + _json(event_id) + head
                           + pk % tuple(values[i] for i in key_index) + middle + item % values)))
    return out
