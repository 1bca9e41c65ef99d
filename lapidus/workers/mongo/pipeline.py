"""Push include/exclude globs into the change stream's ``$match`` stage.

Runs in the mongo worker process, once per stream.  The server then never ships changes of
excluded collections (less network, less decoding), and the resume token still moves past them
(the driver caches the batch's ``postBatchResumeToken``), so a busy excluded collection cannot
push the saved position out of the oplog.

The client-side :class:`lapidus.filters.TableFilter` stays the authority: this module only pushes
down what it can translate *exactly*, and errs on the side of letting a change through
(an include that cannot be translated is not pushed at all; an exclude that cannot be translated
is left out of the ``$nor``).  Translated:

* a pattern without a dot, on ``ns.coll`` (``sessions``, ``audit_*``, ``tmp?``);
* ``db.coll`` patterns whose database part is literal (``shop.audit_*``).  Database names cannot
  contain dots, so the first dot of ``db.coll`` is always the separator and the split is exact.

Patterns with ``[...]`` classes, or wildcards in the database part, are left to the client.
Only collection-level operations are filtered; ``rename`` (which may move a collection into the
included set), ``dropDatabase``, ``invalidate`` and unknown operations always pass, and so do
the changes of ``always`` (the snapshot's watermark collection, docs/snapshots.md: its changes
are the snapshot's watermarks, never events).
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

# Operations whose ``ns`` names one collection and that the filter may drop server-side.
FILTERED_OPERATIONS = ("insert", "update", "replace", "delete", "drop")


def glob_regex(glob: str) -> Optional[str]:
    """A regular expression (valid for MongoDB's PCRE and for Python) matching exactly what
    ``fnmatch`` matches for ``glob``; ``None`` when ``glob`` uses a ``[...]`` class."""
    if "[" in glob:
        return None
    parts = []
    for char in glob:
        if char == "*":
            parts.append("[\\s\\S]*")          # fnmatch's * crosses newlines too
        elif char == "?":
            parts.append("[\\s\\S]")
        else:
            parts.append(re.escape(char))
    # "$" alone also matches before a final newline; the look-ahead rules that out, as \Z does
    # in fnmatch (PCRE's \z would do, but older Python regex engines lack it).
    return "^" + "".join(parts) + "$(?!\\n)"


def _condition(pattern: str) -> Optional[Dict[str, Any]]:
    if "." not in pattern:
        regex = glob_regex(pattern)
        return None if regex is None else {"ns.coll": {"$regex": regex}}
    database, collection = pattern.split(".", 1)
    if any(c in database for c in "*?["):
        return None
    regex = glob_regex(collection)
    if regex is None:
        return None
    return {"ns.db": database, "ns.coll": {"$regex": regex}}


def match_stage(include: Iterable[str] = (), exclude: Iterable[str] = (),
                always: Optional[Tuple[str, str]] = None) -> Optional[Dict[str, Any]]:
    """The ``$match`` stage for these globs, or ``None`` when nothing can be pushed down;
    changes of the collection ``always`` (``(database, collection)``) pass whatever the
    globs say."""
    clauses: List[Dict[str, Any]] = []
    excluded = [c for c in map(_condition, exclude) if c is not None]
    if excluded:
        clauses.append({"$nor": excluded})
    include = list(include)
    if include:
        included = [_condition(p) for p in include]
        if all(c is not None for c in included):
            clauses.append({"$or": included})
    if not clauses:
        return None
    collection_filter = clauses[0] if len(clauses) == 1 else {"$and": clauses}
    alternatives = [{"operationType": {"$nin": list(FILTERED_OPERATIONS)}}, collection_filter]
    if always is not None:
        alternatives.append({"ns.db": always[0], "ns.coll": always[1]})
    return {"$match": {"$or": alternatives}}
