"""Modules that load on first use: a library that imports one at its top but uses it only
in code a process may never run does not make every process pay for it.

The case this exists for: structlog imports ``asyncio`` (which imports ``ssl`` and
``hashlib``) at its top, for its async logging methods, which Lapidus never calls.  The
supervisor imports structlog before it forks the workers, and the workers are synchronous:
with ``asyncio`` loaded in the supervisor, every worker would carry its pages (several MiB of
RSS each, docs/dev/benchmarks.md, Density).  Deferred, ``asyncio`` loads in the process that
first uses it: the dispatcher, a cluster agent, a test.

Runs in any process; :func:`defer` is called before the importing library is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


class DeferredModule(types.ModuleType):
    """Stands in ``sys.modules`` for a module not yet loaded.  ``import name`` gives this
    stand-in (its ``__spec__`` says "loaded"); the first attribute it lacks loads the real
    module, which then replaces it in ``sys.modules`` and lends it all its attributes, so a
    name bound to the stand-in keeps working."""

    def __getattr__(self, attribute: str):
        real = sys.modules.get(self.__name__)
        if real is self or real is None:
            if sys.modules.get(self.__name__) is self:
                del sys.modules[self.__name__]
            real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)
        return getattr(real, attribute)


def defer(name: str) -> None:
    """Put a stand-in for the top-level module ``name`` in ``sys.modules``, unless ``name`` is
    already loaded (or deferred)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        return          # not installed: an import of it fails as it would have
    stand_in = DeferredModule(name)
    # only what the import statement reads before it hands the module over: the spec (to
    # see that the module is not being initialised) and nothing else
    stand_in.__dict__["__spec__"] = spec
    sys.modules[name] = stand_in
