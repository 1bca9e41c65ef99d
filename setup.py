"""Build hook: compile the PostgreSQL worker's hottest module with mypyc where possible.

Package metadata lives in pyproject.toml. ``lapidus/workers/postgresql/pgoutput.py`` (framing
and decoding every row change) is compiled to a C extension from the same Python source: about
a fifth less worker CPU per event (docs/dev/benchmarks.md, "Update 2"). It is an optional
extension: without a C compiler, or with ``LAPIDUS_COMPILE=0``, the pure-Python module serves,
with the same behaviour (tests/unit/test_compiled_build.py compares the two).
"""

import os
import runpy

from setuptools import setup

# The list lives in lapidus/buildinfo.py (a plain file: Lapidus is not installed yet).
COMPILED = list(runpy.run_path(os.path.join("lapidus", "buildinfo.py"))["COMPILED"])


def compiled_extensions():
    if os.environ.get("LAPIDUS_COMPILE", "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    # Only the compiled module's own types are checked; the modules it imports stay Python.
    extensions = mypycify(["--follow-imports=silent", "--ignore-missing-imports", *COMPILED],
                          opt_level="3")
    for extension in extensions:
        extension.optional = True     # a failed C build leaves the pure-Python module
    return extensions


setup(ext_modules=compiled_extensions())
