"""MongoDB's side of a snapshot: collections, ``_id`` chunks, watermark documents, hand-off.

Runs in the mongo worker process, driven by :class:`~.source.MongoSource` (docs/snapshots.md,
section MongoDB):

* :func:`snapshot_collections` lists what the initial snapshot reads (every collection of
  ``database``, or of every database, that passes include/exclude; views, ``system.*`` and the
  watermark collection left out);
* :meth:`MongoSnapshot.start_chunk`, called by the source's ``read`` when no chunk is held:
  opens the window, runs the chunk's ``find`` (keyset on ``_id`` in ``sort`` order, primary,
  majority read concern, ``maxTimeMS``), then writes the chunk's high watermark: one document
  per backend in the watermark collection, replaced with the chunk's mark;
* :meth:`MongoSnapshot.watermark` and :meth:`MongoSnapshot.saw_change` sit in front of the
  change mapper: changes evict ``_id`` values of the held chunk, the high watermark's change
  turns what is left into ``read`` events right there in the stream.  Changes of the
  watermark collection never become events.

Why a watermark *document* and no low watermark: the stream orders the watermark's write
after every write the ``find`` could see (it was made after the ``find`` returned), and the
window opens before the ``find`` is sent, so any change the worker reads from then on evicts
(a change it read before is already visible to the ``find``).  A low watermark would add a
write and a round trip and decide nothing.  Cluster times were not used: a ``find``'s
``operationTime`` does not order it against writes still in flight (oplog holes), a write
does.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pymongo import ReadPreference
from pymongo.errors import ExecutionTimeout, OperationFailure, PyMongoError
from pymongo.read_concern import ReadConcern

from ..base import BackendError
from ..snapshot.progress import SnapshotProgress
from ..snapshot.run import SnapshotRefused, SnapshotRun
from ..snapshot.window import Row, ValueKeyedWindow
from . import errors
from .bson_json import document_to_json, to_json
from .changes import ROW_OPERATIONS, commit_time
from .keyset import after, id_text, key_from_json, key_text, key_to_json, parse_filter
from .position import token_position

Namespace = Tuple[str, str]

#: the watermark collection when ``snapshot_watermarks`` is not set
DEFAULT_WATERMARKS = "lapidus_watermarks"
#: its database when the whole deployment is watched
DEFAULT_WATERMARK_DATABASE = "lapidus"

_INTERNAL_DATABASES = ("admin", "config", "local")

# DDL that makes every held document of the collection stale
_EMPTIES = ("drop", "rename", "dropDatabase", "invalidate")


def watermark_namespace(backend: str, database: Optional[str], options: Mapping[str, Any]
                        ) -> Namespace:
    """``(database, collection)`` of the watermark documents (``snapshot_watermarks``:
    ``collection`` in the watched database, or ``database.collection``).

    It must be inside what the stream watches, or the watermarks never arrive: refused,
    FATAL, otherwise.
    """
    value = options.get("snapshot_watermarks") or DEFAULT_WATERMARKS
    if not isinstance(value, str) or value.startswith(".") or value.endswith("."):
        raise BackendError(f'backend "{backend}": snapshot_watermarks must be "collection" or '
                           f'"database.collection", not {value!r}', fatal=True)
    if "." in value:
        db, coll = value.split(".", 1)
        if database and db != database:
            raise BackendError(
                f'backend "{backend}": snapshot_watermarks = "{value}" is outside the watched '
                f'database "{database}", so its watermarks would never reach the change '
                f'stream; name a collection of "{database}" (default "{DEFAULT_WATERMARKS}")',
                fatal=True)
        return db, coll
    return (database or DEFAULT_WATERMARK_DATABASE), value


def _collections(client, db: str, watermarks: Namespace) -> List[str]:
    names = client[db].list_collection_names(filter={"type": "collection"})
    return sorted(n for n in names
                  if not n.startswith("system.") and (db, n) != watermarks)


def snapshot_collections(client, database: Optional[str], table_filter,
                         watermarks: Namespace) -> List[Namespace]:
    """The collections an initial snapshot reads, in ``database.collection`` order."""
    databases = [database] if database else sorted(
        d for d in client.list_database_names() if d not in _INTERNAL_DATABASES)
    return [(db, coll) for db in databases for coll in _collections(client, db, watermarks)
            if table_filter.allows(db, coll)]


class MongoWindow(ValueKeyedWindow):
    """A held chunk keyed by the BSON ``_id`` itself (:func:`.keyset.key_text`), not by its
    JSON form: an ObjectId and the string of its hex digits are different documents."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ids: Dict[str, str] = {}     # key text -> the tail of the read event's id

    def hold_documents(self, entries: Sequence[Tuple[Any, dict, dict]],
                       last_key: Optional[List[Any]]) -> None:
        """``(raw _id, pk, item)`` in ``_id`` order, and the checkpoint's form of the last."""
        for raw, pk, item in entries:
            key = key_text(raw)
            self.rows[key] = (pk, item)
            self.ids[key] = id_text(raw)
        self.selected = len(entries)
        self.last_key = last_key

    def evict(self, raw: Any) -> None:
        if self.rows.pop(key_text(raw), None) is not None:
            self.evicted += 1

    def evict_all(self) -> None:
        self.evicted += len(self.rows)
        self.rows.clear()

    def remaining_keyed(self) -> List[Tuple[str, Row]]:
        """The rows left, each with its id text from the BSON ``_id`` (:func:`.keyset.id_text`),
        not from ``pk``, whose JSON form can be the same for two documents."""
        ids = self.ids
        return [(ids[key], row) for key, row in self.rows.items()]


class MongoSnapshot(SnapshotRun):
    """One snapshot run (initial or backfill) of one mongo backend: the database half."""

    window_class = MongoWindow

    def __init__(self, backend: str, options: dict, settings, client,
                 progress: SnapshotProgress, log, watermarks: Namespace):
        super().__init__(backend, options, progress, log)
        self.settings = settings
        self.client = client            # the source's client (same codec options as the stream)
        self.watermarks = watermarks
        self.timeout_ms = max(1, int(self.timeout_seconds * 1000))
        try:
            self.where = parse_filter(progress.where)
        except ValueError as exc:     # checked when the backfill began: a hand-edited file
            raise BackendError(
                f'backend "{backend}": the saved backfill filter {progress.where!r} does not '
                f"parse ({exc}); fix or delete the \"snapshot\" key of the checkpoint",
                fatal=True) from None

    # -- the database side ----------------------------------------------------------------

    def collection(self, db: str, coll: str):
        """Read from the primary at majority: a secondary could lag behind what the stream
        already delivered, and a majority read never sees a write a rollback takes back."""
        return self.client[db].get_collection(coll, read_preference=ReadPreference.PRIMARY,
                                              read_concern=ReadConcern("majority"))

    def chunk_filter(self) -> dict:
        conditions = []
        if self.progress.last_key is not None:
            conditions.append(after(key_from_json(self.progress.last_key[0])))
        if self.where:
            conditions.append(self.where)   # ANDed: an $or in it cannot escape the keyset
        if not conditions:
            return {}
        return conditions[0] if len(conditions) == 1 else {"$and": conditions}

    def start_chunk(self) -> None:
        """The next chunk's ``find`` and its high watermark; the documents are held."""
        db, coll = self.progress.table
        # Opened before the find: changes read from here on all evict (module docstring).
        window = self.open_window(db, coll, ("_id",))
        try:
            docs = list(self.collection(db, coll).find(
                self.chunk_filter(), sort=[("_id", 1)], limit=self.chunk_rows,
                batch_size=self.chunk_rows, max_time_ms=self.timeout_ms))
            self._write_mark(f"{window.watermark}:high")
        except ExecutionTimeout:
            self.window = None
            raise BackendError(
                f'backend "{self.backend}": a snapshot chunk of {db}.{coll} '
                f"({self.chunk_rows} documents) took longer than snapshot_chunk_timeout "
                f"({self.timeout_seconds:g} s); make snapshot_chunk_rows smaller or "
                f"snapshot_chunk_timeout larger", fatal=True) from None
        except PyMongoError as exc:
            self.window = None
            raise errors.describe(self.settings, exc,
                                  f"reading a snapshot chunk of {db}.{coll}") from None
        window.hold_documents(
            [(doc["_id"], {"_id": to_json(doc["_id"])}, document_to_json(doc)) for doc in docs],
            [key_to_json(docs[-1]["_id"])] if docs else None)

    def _write_mark(self, mark: str) -> None:
        # One document per backend, replaced each chunk: the collection never grows, and a
        # replace's change carries the whole new document (the mark) in every server mode.
        db, coll = self.watermarks
        self.client[db][coll].replace_one(
            {"_id": self.backend},
            {"mark": mark, "at": _dt.datetime.now(_dt.timezone.utc)}, upsert=True)

    # -- the stream side ------------------------------------------------------------------

    def watermark(self, change: Mapping[str, Any], events: List) -> bool:
        """A change of the watermark collection: True (and the chunk's ``read`` events
        appended to ``events``) when it is the held chunk's high watermark."""
        window = self.window
        if window is None or change.get("operationType") not in ("insert", "replace"):
            return False
        mark = (change.get("fullDocument") or {}).get("mark")
        if not isinstance(mark, str) or window.watermark_kind(mark) != "high":
            return False        # another backend's, or one of a chunk given up before
        self.emit_window(events, token_position(change["_id"]), commit_time(change))
        return True

    def saw_change(self, change: Mapping[str, Any]) -> None:
        """Any other change while a chunk is held: evict what it touches."""
        window = self.window
        if window is None:
            return
        operation = change.get("operationType")
        ns = change.get("ns") or {}
        mine = ns.get("db") == window.schema and ns.get("coll") == window.table
        if operation in ROW_OPERATIONS:
            if mine:
                key = change.get("documentKey") or {}
                if "_id" in key:
                    window.evict(key["_id"])
            return
        if operation in _EMPTIES:
            to = change.get("to") or {}
            renamed_onto = to.get("db") == window.schema and to.get("coll") == window.table
            whole_db = operation == "dropDatabase" and ns.get("db") == window.schema
            if mine or renamed_onto or whole_db or operation == "invalidate":
                window.evict_all()


def backfill_target(client, database: Optional[str], table: str, table_filter,
                    watermarks: Namespace, backend: str) -> Namespace:
    """``(database, collection)`` for a backfill of ``table`` (``collection`` or
    ``database.collection``); raises :class:`SnapshotRefused` naming the thing, the reason
    and the fix."""
    where = f"the {database} database" if database else "any database"
    if database:
        # "shop.items" names shop's "items", unless a collection is called "shop.items"
        if table.startswith(f"{database}.") and \
                table not in _collections(client, database, watermarks):
            table = table[len(database) + 1:]
        candidates = [(database, table)]
    elif "." in table:
        candidates = [tuple(table.split(".", 1))]
    else:
        candidates = [(db, table) for db in client.list_database_names()
                      if db not in _INTERNAL_DATABASES]
    if any(c == watermarks for c in candidates):
        raise SnapshotRefused(f'backend "{backend}": cannot backfill {table}: it is the '
                              f"snapshot watermark collection (snapshot_watermarks), whose "
                              f"changes are never events; name a collection of yours")
    found = [(db, coll) for db, coll in candidates
             if coll in _collections(client, db, watermarks)]
    if not found:
        raise SnapshotRefused(f'backend "{backend}": cannot backfill {table}: no such '
                              f"collection in {where}; check the name (lapidusctl status "
                              f"lists what the backend streams)")
    if len(found) > 1:
        names = ", ".join(f"{db}.{coll}" for db, coll in found)
        raise SnapshotRefused(f'backend "{backend}": cannot backfill {table}: several '
                              f"databases have it ({names}); name it as database.collection")
    db, coll = found[0]
    if not table_filter.allows(db, coll):
        raise SnapshotRefused(f'backend "{backend}": cannot backfill {db}.{coll}: '
                              f"include_tables / exclude_tables leave it out of the stream, so "
                              f"its changes would not follow the read events; change the "
                              f"filters first")
    return db, coll


def check_filter(client, backend: str, namespace: Namespace, where: Optional[str]) -> None:
    """Parse a backfill's ``where`` and let the server judge it (one ``find`` of one
    document); raises :class:`SnapshotRefused` with the reason."""
    db, coll = namespace
    try:
        condition = parse_filter(where)
    except ValueError as exc:
        raise SnapshotRefused(f'backend "{backend}": cannot backfill {db}.{coll} with where '
                              f"{where!r}: {exc}; give a JSON filter document such as "
                              f'{{"status": "open"}} (Extended JSON for BSON types)') from None
    if condition is None:
        return
    try:
        client[db][coll].find_one(condition, max_time_ms=10_000)
    except OperationFailure as exc:
        reason = (exc.details or {}).get("errmsg") or str(exc)
        raise SnapshotRefused(f'backend "{backend}": cannot backfill {db}.{coll} with where '
                              f"{where!r}: the server rejects the filter ({reason}); fix the "
                              f"filter") from None


def estimates(client, namespaces: Sequence[Namespace]) -> Dict[Namespace, Optional[int]]:
    """``estimated_document_count`` of each collection (from metadata: cheap), None when
    the server will not say."""
    out: Dict[Namespace, Optional[int]] = {}
    for db, coll in namespaces:
        try:
            out[(db, coll)] = int(client[db][coll].estimated_document_count(maxTimeMS=5000))
        except PyMongoError:
            out[(db, coll)] = None   # a status figure: never a reason to stop the stream
    return out
