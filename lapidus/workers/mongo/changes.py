"""Change-stream documents to :class:`lapidus.events.Event`.

Runs in the mongo worker process, once per change; pure (no I/O), so the unit tests drive it
with recorded change documents.  The mapping (docs/mongodb.md shows whole events):

=============================  ===================================================================
change stream                  event
=============================  ===================================================================
``operationType``              ``type``: ``insert``, ``update``, ``replace``, ``delete``;
                               DDL and ``invalidate``: ``schema``
``ns.db`` / ``ns.coll``        ``schema`` / ``table``
``documentKey._id``            ``pk`` = ``{"_id": ...}``
``fullDocument``               ``item`` (insert, replace; update: the post-image or the looked-up
                               document, ``null`` when it no longer exists); delete: ``null``
``fullDocumentBeforeChange``   ``before`` (pre-images, MongoDB 6.0+); without one, update,
                               replace and delete carry the key (``{"_id": ...}``), insert ``null``
``updateDescription``          ``update`` = ``{"set": {path: value}, "unset": [path]}`` plus
                               ``"truncated": {path: new_length}`` when arrays were shortened
``_id`` (resume token)         ``position`` (its ``_data`` hex) and ``id`` =
                               ``<backend>:<position>:0``
``lsid.id`` + ``txnNumber``    ``txid`` = ``"<session uuid>:<txnNumber>"`` (multi-document
                               transactions only), else ``null``
``wallTime``, ``clusterTime``  ``ts``, RFC 3339 UTC with milliseconds
=============================  ===================================================================

A ``replace`` event has no ``update`` field: the whole document was replaced, so ``item`` is
all there is.  ``drop``, ``rename``, ``dropDatabase``,
``invalidate`` and any operation this module does not know become ``schema`` events whose
``item`` describes the operation: ``{"operation": "rename", "to": {"schema": ..., "table": ...}}``.

Every change carries its own resume token, including each statement of a multi-document
transaction (the token holds the index inside the transaction), so ``<position>:0`` is unique
and a replay of the same change yields the same id.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Mapping, Optional

from bson.binary import UUID_SUBTYPE, Binary

from ...events import Event
from ...filters import TableFilter
from .bson_json import document_to_json, format_datetime, to_json
from .position import token_position

ROW_OPERATIONS = frozenset({"insert", "update", "replace", "delete"})

_EPOCH = _dt.datetime(1970, 1, 1)


class ChangeMapper:
    """Turns the change documents of one backend's stream into events.

    ``database`` is the watched database (``None``: the whole deployment); it names the schema
    of ``invalidate`` events, which carry no namespace.
    """

    def __init__(self, backend: str, table_filter: TableFilter, database: Optional[str]):
        self.backend = backend
        self.table_filter = table_filter
        self.database = database

    def event(self, change: Mapping[str, Any]) -> Optional[Event]:
        """The event for ``change``, or ``None`` when the filter excludes its collection."""
        operation = change["operationType"]
        ns = change.get("ns") or {}
        schema = ns.get("db", self.database)
        table = ns.get("coll")
        if operation in ROW_OPERATIONS:
            if not self.table_filter.allows(schema, table):
                return None
            return self._row_event(change, operation, schema, table)
        if operation == "rename":
            to = change.get("to") or {}
            # Streamed when either side is: renaming into the included set is how documents
            # appear there without inserts; renaming out of it is how they disappear.
            if not (self.table_filter.allows(schema, table)
                    or self.table_filter.allows(to.get("db", schema), to.get("coll", ""))):
                return None
            item = {"operation": "rename",
                    "to": {"schema": to.get("db"), "table": to.get("coll")}}
        elif table is not None and not self.table_filter.allows(schema, table):
            return None            # drop (or an expanded DDL event) of an excluded collection
        else:
            item = {"operation": operation}
            description = change.get("operationDescription")
            if description:
                item["description"] = document_to_json(description)
        return self._event(change, "schema", schema, table, None, item, None)

    def _row_event(self, change: Mapping[str, Any], operation: str, schema: str,
                   table: str) -> Event:
        key = change.get("documentKey") or {}
        pk = {"_id": to_json(key["_id"])} if "_id" in key else None
        if operation == "delete":
            item = None
        else:
            full = change.get("fullDocument")
            item = document_to_json(full) if full is not None else None
        before_doc = change.get("fullDocumentBeforeChange")
        if before_doc is not None:
            before = document_to_json(before_doc)
        elif operation == "insert" or pk is None:
            before = None
        else:
            # No pre-image (not configured, or expired): the key, as EVENTS.md asks of every
            # source that lacks the old row.
            before = dict(pk)
        update = None
        if operation == "update":
            update = _update_description(change.get("updateDescription") or {})
        return self._event(change, operation, schema, table, pk, item, before, update)

    def _event(self, change: Mapping[str, Any], type_: str, schema: Optional[str],
               table: Optional[str], pk, item, before, update=None) -> Event:
        position = token_position(change["_id"])
        return Event(
            id=f"{self.backend}:{position}:0",
            type=type_,
            backend=self.backend,
            schema=schema,
            table=table,
            pk=pk,
            item=item,
            before=before,
            position=position,
            txid=transaction_id(change),
            ts=commit_time(change),
            update=update,
        )


def _update_description(description: Mapping[str, Any]) -> dict:
    out = {
        "set": document_to_json(description.get("updatedFields") or {}),
        "unset": list(description.get("removedFields") or ()),
    }
    truncated = description.get("truncatedArrays")
    if truncated:
        out["truncated"] = {t["field"]: int(t["newSize"]) for t in truncated}
    return out


def transaction_id(change: Mapping[str, Any]) -> Optional[str]:
    """``"<session uuid>:<txnNumber>"`` for a change made in a multi-document transaction.

    MongoDB identifies a transaction by its logical session id and the transaction number
    inside that session; both are on every change of the transaction (and only there).
    """
    number = change.get("txnNumber")
    lsid = change.get("lsid")
    if number is None or not lsid:
        return None
    session = lsid.get("id")
    if isinstance(session, Binary) and session.subtype == UUID_SUBTYPE:
        session = session.as_uuid()
    elif isinstance(session, (bytes, Binary)):
        session = bytes(session).hex()
    return f"{session}:{int(number)}"


def commit_time(change: Mapping[str, Any]) -> Optional[str]:
    """``wallTime`` (MongoDB 6.0+, milliseconds), else ``clusterTime``'s seconds."""
    wall = change.get("wallTime")
    if isinstance(wall, _dt.datetime):
        return format_datetime(wall)
    cluster = change.get("clusterTime")
    if cluster is not None:
        return format_datetime(_EPOCH + _dt.timedelta(seconds=cluster.time))
    return None
