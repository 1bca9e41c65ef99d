"""Every configuration setting, declared once.

A :class:`Setting` names a key, its aliases (the original Lapidus spellings), its kind (which
checks and normalises a value), its default, a one-line help and the backend types it applies
to.  :mod:`lapidus.config` validates files against these declarations and
:func:`render_markdown` writes the settings tables of ``docs/configuration.md`` from them, so
the validator and the documentation cannot drift apart (a unit test compares the two).

Stdlib-only leaf package: imported by the supervisor before fork, by ``lapidus -t`` and by
``lapidusctl``.  Regenerate the documentation with
``python -m lapidus.settings --write docs/configuration.md``.

The package only re-exports; each module has one job:

* :mod:`.names`: backend types, plugin names and aliases, name rules, names derived from a
  backend name.
* :mod:`.context`: what a kind or a derived default may look at; resolving paths.
* :mod:`.kinds`: the kinds of values, each a check and a normalisation; :class:`Invalid`.
* :mod:`.setting`: :class:`Setting` and :class:`Derived`, the declaration records.
* :mod:`.sections`: the top level, ``[log]``, ``[control]``, ``[http]``, ``[supervisor]``,
  ``[cluster]``.
* :mod:`.backends`: ``[[backends]]``, common and per type, and the lookups over them.
* :mod:`.messages`: how errors show values; did-you-mean suggestions.
* :mod:`.secret_keys`: which keys hold secrets.
* :mod:`.docs` (and ``__main__``): the generated reference in ``docs/configuration.md``.
"""

from __future__ import annotations

from .backends import (
    BACKEND_COMMON, BACKEND_TYPED, MONGO, MY, PG, SQL, all_backend_keys, backend_keys_elsewhere,
    backend_settings,
)
from .context import Context, resolve_path
from .docs import DOC_BEGIN, DOC_END, render_markdown, update_doc
from .kinds import (
    BackendList, BackendType, Bool, ByteSize, Choice, Globs, Int, Invalid, Kind, Listen,
    MongoUri, PathKind, Pattern, Plugins, Seconds, Str, Table, glob_problem, split_listen,
)
from .messages import describe, suggest
from .names import (
    BACKEND_TYPES, BUILTIN_PLUGINS, DERIVED_SERVER_ID_MIN, NAME_RE, PLUGIN_ALIASES,
    SERVER_ID_MAX, SERVER_ID_MIN, SLOT_RE, derived_server_id, pg_identifier,
)
from .secret_keys import is_secret_key
from .sections import CLUSTER, CONTROL, HTTP, LOG, SECTIONS, SUPERVISOR, TOP_LEVEL
from .setting import UNSET, Derived, Setting

__all__ = [
    "BACKEND_COMMON", "BACKEND_TYPED", "BACKEND_TYPES", "BUILTIN_PLUGINS", "BackendList",
    "BackendType", "Bool", "ByteSize", "CLUSTER", "CONTROL", "Choice", "Context",
    "DERIVED_SERVER_ID_MIN",
    "DOC_BEGIN", "DOC_END", "Derived", "Globs", "HTTP", "Int", "Invalid", "Kind", "LOG",
    "Listen", "MONGO", "MY", "MongoUri", "NAME_RE", "PG", "PLUGIN_ALIASES", "PathKind",
    "Pattern", "Plugins", "SECTIONS", "SERVER_ID_MAX", "SERVER_ID_MIN", "SLOT_RE", "SQL",
    "SUPERVISOR", "Seconds", "Setting", "Str", "TOP_LEVEL", "Table", "UNSET",
    "all_backend_keys", "backend_keys_elsewhere", "backend_settings", "derived_server_id",
    "describe", "glob_problem", "is_secret_key", "pg_identifier", "render_markdown", "resolve_path",
    "split_listen", "suggest", "update_doc",
]
