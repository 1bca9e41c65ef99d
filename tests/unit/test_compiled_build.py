"""The compiled pgoutput decoder (setup.py, mypyc) against its own Python source.

Both builds come from one source file; the test loads that source as a second, pure-Python
module and requires the same messages, sizes and errors from both over a seeded random
workload of every message type and column kind, cut at many read boundaries.  When Lapidus was
installed without a compiler both sides are the pure module and the comparison is trivial; CI
installs with one and requires the compiled build (the one its benchmarks measure).
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from pathlib import Path

import pytest

from lapidus import buildinfo
from lapidus.workers.postgresql import pgoutput

from .test_pgoutput_decoder import (BOOL, FLOAT8, INT4, INT8, JSONB, NUMERIC, TEXT, TIMESTAMPTZ,
                                    UNCHANGED, FakeCatalog, FakeRelations, begin, commit, delete,
                                    insert, logical_message, relation, spool, truncate, update)
from lapidus.filters import TableFilter

PACKAGE = "lapidus.workers.postgresql"


def pure_pgoutput():
    """pgoutput.py loaded from source as its own module (relative imports still resolve)."""
    name = f"{PACKAGE}._pgoutput_from_source"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(pgoutput.__file__).with_name("pgoutput.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def decoder_of(module):
    return module.PgOutputDecoder(FakeCatalog(), TableFilter(exclude=["public.hidden"]),
                                  "pub", relations=FakeRelations())


COLUMNS = [("id", INT8, True), ("name", TEXT, False), ("price", NUMERIC, False),
           ("ok", BOOL, False), ("at", TIMESTAMPTZ, False), ("ratio", FLOAT8, False),
           ("doc", JSONB, False), ("n", INT4, False)]


def random_value(rng: random.Random, oid: int):
    roll = rng.random()
    if roll < 0.1:
        return None
    if roll < 0.15:
        return UNCHANGED
    if oid in (INT8, INT4):
        return str(rng.randint(-2**31, 2**31 - 1))
    if oid == NUMERIC:
        return f"{rng.randint(-10**12, 10**12)}.{rng.randint(0, 99):02d}"
    if oid == BOOL:
        return rng.choice("tf")
    if oid == TIMESTAMPTZ:
        return f"2026-11-{rng.randint(1, 30):02d} 12:{rng.randint(0, 59):02d}:01.5+00"
    if oid == FLOAT8:
        return rng.choice(["1.5", "-0", "NaN", "Infinity", "1e308", "3.14159"])
    if oid == JSONB:
        return rng.choice(['{"a": 1.10}', "[1, 2]", '"x\\ny"', "null"])
    return "".join(rng.choice("ab\n\0é€ .*>") for _ in range(rng.randint(0, 20)))


def workload(seed: int) -> bytes:
    rng = random.Random(seed)
    tables = {16400: "items", 16401: "hidden"}
    messages = [relation(relid, "public", name, COLUMNS) for relid, name in tables.items()]
    lsn = 0x1000
    for _ in range(40):
        lsn += 0x100
        messages.append(begin(lsn, 848_406_513_126_894 + rng.randint(0, 10**7), lsn))
        for _ in range(rng.randint(1, 8)):
            relid = rng.choice(list(tables))
            row = [str(rng.randint(1, 10**6))] + [random_value(rng, oid)
                                                  for _, oid, _ in COLUMNS[1:]]
            kind = rng.choice("IUUDTM")
            if kind == "I":
                messages.append(insert(relid, row))
            elif kind == "U":
                old = rng.choice([None, [row[0]] + [None] * 7, row])
                messages.append(update(relid, row, old=old,
                                       old_kind=b"K" if old and old[1] is None else b"O"))
            elif kind == "D":
                messages.append(delete(relid, [row[0]] + [None] * 7))
            elif kind == "T":
                messages.append(truncate(*tables))
            else:
                messages.append(logical_message("p", rng.randbytes(rng.randint(0, 9)), lsn))
        messages.append(commit(lsn, lsn + 0x30, 848_406_513_126_894))
    return spool(*messages)


def decode_in_reads(module, data: bytes, read_size: int):
    """What the spool reader gets from ``module``'s decoder when ``data`` arrives in reads of
    ``read_size`` bytes: (message, size) pairs, or the error's class name and text."""
    decoder, out, buffer, pos = decoder_of(module), [], b"", 0
    try:
        for start in range(0, len(data), read_size):
            buffer = buffer[pos:] + data[start:start + read_size]
            pos = 0
            while True:
                run, pos = decoder.decode_run(buffer, pos, 3, (1, start))
                if not run:
                    break
                out += run
    except Exception as exc:
        return out, f"{type(exc).__name__}: {exc}"
    return out, None


@pytest.mark.parametrize("seed", range(6))
def test_compiled_and_source_builds_decode_alike(seed):
    data = workload(seed)
    pure = pure_pgoutput()
    assert pure.__file__.endswith("pgoutput.py") and pure is not pgoutput
    for read_size in (1, 7, 64, 4096, len(data)):
        compiled = decode_in_reads(pgoutput, data, read_size)
        assert compiled == decode_in_reads(pure, data, read_size), read_size
        messages, error = compiled
        assert error is None and sum(size for _, size in messages) == len(data)


def test_compiled_and_source_builds_fail_alike_on_damage():
    data = workload(99)
    pure = pure_pgoutput()
    for cut in range(200, len(data), 997):
        damaged = data[:cut] + b"\x07" + data[cut + 1:]
        assert decode_in_reads(pgoutput, damaged, 512)[1] == \
            decode_in_reads(pure, damaged, 512)[1], cut


@pytest.mark.skipif(not os.environ.get("CI"), reason="a developer may install without a compiler")
def test_ci_runs_the_compiled_decoder():
    assert buildinfo.is_compiled(pgoutput.__name__), (
        "pgoutput was not compiled: is a C compiler installed, and mypy reachable for pip?")
    assert buildinfo.stale_builds() == []
