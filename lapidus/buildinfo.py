"""Which Lapidus modules are built as C extensions, and whether such a build is stale.

Plain module without imports from Lapidus: ``setup.py`` reads ``COMPILED`` from this file
before Lapidus is installed.  ``pip install`` compiles these modules with mypyc from the same
Python source when it can (see setup.py); without a C compiler, or with ``LAPIDUS_COMPILE=0``,
the pure-Python modules serve.  An editable install (``make venv``) puts the compiled files
beside the sources, where they shadow them: after an edit they are stale until the next
``make venv``, which the test suite checks (tests/conftest.py).
"""

from __future__ import annotations

import importlib.util
import os
from typing import List, Optional

#: source files compiled by setup.py, relative to the project root
COMPILED = ("lapidus/workers/postgresql/pgoutput.py",)


def module_name(path: str) -> str:
    return path[:-len(".py")].replace("/", ".")


def compiled_file(name: str) -> Optional[str]:
    """The C extension that importing module ``name`` loads, or None (plain Python)."""
    spec = importlib.util.find_spec(name)
    if spec and spec.origin and not spec.origin.endswith(".py"):
        return spec.origin
    return None


def is_compiled(name: str) -> bool:
    return compiled_file(name) is not None


def stale_builds() -> List[str]:
    """Compiled modules whose Python source changed after they were built."""
    stale = []
    for path in COMPILED:
        name = module_name(path)
        built = compiled_file(name)
        if built is None:
            continue
        source = os.path.join(os.path.dirname(built), os.path.basename(path))
        if os.path.exists(source) and os.path.getmtime(source) > os.path.getmtime(built):
            stale.append(name)
    return stale
