"""Integration: Lapidus's row image decoder gives the same values as the library's decoding.

Every rows event read from the real MariaDB is decoded both ways from the same bytes: by
:mod:`lapidus.workers.mysql.rowimage` and by python-mysql-replication followed by
:func:`lapidus.workers.mysql.values.convert_row` (the path tables the decoder does not cover
take).  Rows: the limits, NULL and zero rows of the type table, then seeded random rows over
every column type, DECIMALs of every digit-group layout, charsets, 1- and 2-byte lengths and
enums, and updates and deletes with full and minimal row images (left-out columns).
"""

from __future__ import annotations

import random
import time

import pytest
from pymysqlreplication.row_event import TableMapEvent, UpdateRowsEvent

from lapidus.workers.mysql.reader import row_data
from lapidus.workers.mysql.values import convert_row

pytest_plugins = ["tests.integration.mysql_fixtures"]
from tests.integration.test_mysql_types import (  # noqa: E402
    MAX_ROW, MIN_ROW, NULL_ROW, TABLE, ZERO_ROW,
)

pytestmark = pytest.mark.integration

DECIMALS = ((1, 0), (2, 2), (3, 1), (9, 0), (9, 9), (10, 0), (10, 10), (18, 9), (19, 10),
            (20, 0), (27, 13), (30, 15), (65, 0), (65, 30))
ENUM_MEMBERS = [f"m{i}" for i in range(300)]          # over 255 members: a 2-byte index
MORE = ("CREATE TABLE more (id INT PRIMARY KEY, "
        + ", ".join(f"d{p}_{s} DECIMAL({p},{s})" for p, s in DECIMALS)
        + ", c_latin1 VARCHAR(20) CHARACTER SET latin1, c_long VARCHAR(300), "
          "c_tinytext TINYTEXT, c_mediumblob MEDIUMBLOB, c_dt3 DATETIME(3), c_t2 TIME(2), "
          "c_ts4 TIMESTAMP(4) NULL, c_bit9 BIT(9), c_char_bin CHAR(5) CHARACTER SET binary, "
          "c_enum ENUM(" + ", ".join(f"'{m}'" for m in ENUM_MEMBERS) + "), "
          "c_json JSON, c_float FLOAT, c_year YEAR)")


def random_decimal(rng: random.Random, precision: int, scale: int) -> str:
    whole = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, precision - scale)))
    frac = "".join(rng.choice("0123456789") for _ in range(scale))
    return ("-" if rng.random() < 0.4 else "") + (whole or "0") + ("." + frac if scale else "")


def hex_literal(rng: random.Random, most: int) -> str:
    return "X'" + rng.randbytes(rng.randint(0, most)).hex() + "'"


def random_more_row(rng: random.Random, row_id: int) -> str:
    def maybe(value: str) -> str:
        return "NULL" if rng.random() < 0.15 else value
    values = [str(row_id)]
    values += [maybe(f"'{random_decimal(rng, p, s)}'") for p, s in DECIMALS]
    values += [
        maybe("'" + rng.choice(["café", "naïve", "Ärger", "x"]) + "'"),
        maybe("'" + "é😀ab"[rng.randint(0, 3)] * rng.randint(0, 300) + "'"),
        maybe("'tiny " + str(rng.random()) + "'"),
        maybe(hex_literal(rng, 40)),
        maybe(f"'{rng.randint(1000, 9999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
              f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}."
              f"{rng.randint(0, 999):03d}'"),
        maybe(f"'{rng.choice(['-', ''])}{rng.randint(0, 838)}:{rng.randint(0, 59):02d}:"
              f"{rng.randint(0, 59):02d}.{rng.randint(0, 99):02d}'"),
        maybe(f"FROM_UNIXTIME({rng.randint(1, 2**31 - 1)}.{rng.randint(0, 9999):04d})"),
        maybe(f"b'{rng.getrandbits(9):09b}'"),
        maybe(hex_literal(rng, 5)),
        maybe(f"'{rng.choice(ENUM_MEMBERS)}'"),
        maybe("'" + rng.choice(['{"a": 1.50, "b": [1, 2e3, "ü"]}', '[]', '"s"', '12345678901234567890.1']) + "'"),
        maybe(str(rng.uniform(-1e6, 1e6))),
        maybe(str(rng.choice([0, 1901, 2000, 2155]))),
    ]
    return f"INSERT INTO more VALUES ({', '.join(values)})"


def random_types_row(rng: random.Random, row_id: int) -> str:
    def maybe(value: str) -> str:
        return "NULL" if rng.random() < 0.15 else value
    values = [str(row_id)]
    for bits, unsigned in ((8, False), (8, True), (16, False), (16, True), (24, False),
                           (24, True), (32, False), (32, True), (64, False), (64, True)):
        low, high = (0, 2**bits - 1) if unsigned else (-(2**(bits - 1)), 2**(bits - 1) - 1)
        values.append(maybe(str(rng.randint(low, high))))
    values += [maybe(f"'{random_decimal(rng, 65, 30)}'"), maybe(f"'{random_decimal(rng, 10, 2)}'"),
               maybe(str(rng.uniform(-1e30, 1e30))), maybe(repr(rng.uniform(-1e300, 1e300))),
               maybe(str(rng.randint(0, 1))), maybe(str(rng.getrandbits(64))),
               maybe(f"'{rng.randint(1000, 9999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}'"),
               maybe(f"'-{rng.randint(0, 838)}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}."
                     f"{rng.randint(0, 999999):06d}'"),
               maybe(f"'{rng.randint(0, 838)}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}'"),
               maybe(f"'{rng.randint(1000, 9999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                     f"12:34:56.{rng.randint(0, 999999):06d}'"),
               maybe("'2026-11-30 01:02:03'"),
               maybe(f"FROM_UNIXTIME({rng.randint(1, 2**31 - 1)}.{rng.randint(0, 999999):06d})"),
               maybe(str(rng.randint(1901, 2155))),
               maybe("'c😀'"), maybe("'v" + "ü" * rng.randint(0, 90) + "'"), maybe("'t\\n😀'"),
               maybe("0x0102"), maybe(hex_literal(rng, 10)), maybe("0x00ff00"),
               maybe(f"'{rng.choice(['small', 'medium', 'large'])}'"),
               maybe("'" + ",".join(rng.sample("abcd", rng.randint(0, 4))) + "'"),
               maybe("'{\"k\": [1, 2.50, null]}'"),
               maybe("ST_GeomFromText('LINESTRING(0 0, 1.5 2)')")]
    return f"INSERT INTO types VALUES ({', '.join(values)})"


def library_images(plan, event, update):
    if update:
        return [(convert_row(plan, r["before_values"], r["before_none_sources"]),
                 convert_row(plan, r["after_values"], r["after_none_sources"]))
                for r in event.rows]
    return [convert_row(plan, r["values"], r["none_sources"]) for r in event.rows]


def test_decoder_gives_the_librarys_values_for_every_row(sql, open_source):
    rng = random.Random(20261130)
    sql.run(TABLE, MORE, "SET time_zone = '+00:00'")
    source = open_source()
    statements = [MIN_ROW, MAX_ROW, NULL_ROW, ZERO_ROW]
    statements += [random_types_row(rng, 100 + i) for i in range(150)]
    statements += [random_more_row(rng, i) for i in range(150)]
    statements += ["UPDATE types SET t_set = 'b', t_dec2 = -t_dec2 WHERE id < 120",
                   "DELETE FROM more WHERE id % 3 = 0",
                   "SET SESSION binlog_row_image = 'MINIMAL'",
                   "UPDATE more SET c_json = '{\"x\": 1}', d65_30 = 1.5 WHERE id % 3 = 1",
                   "DELETE FROM types WHERE id > 200",
                   "SET SESSION binlog_row_image = 'FULL'",
                   "INSERT INTO types (id) VALUES (9999)"]
    sql.run(*statements)
    sql.run("CREATE TABLE done (id INT PRIMARY KEY)", "INSERT INTO done VALUES (1)")

    reader, changes = source._reader, source._changes
    reader.set_deadline(time.monotonic() + 60)
    compared = {"types": 0, "more": 0}
    maps_seen = {"types": [], "more": []}
    left_out_seen = False
    while True:
        event = reader.fetchone()
        if isinstance(event, TableMapEvent):
            maps_seen.setdefault(event.table, []).append(event)
            changes.feed(event, reader.log_file, reader.log_pos)
            continue
        if not hasattr(event, "columns_present_bitmap"):
            continue
        if event.table == "done":
            break
        plan, decoder = changes._plans[event.table_id]
        assert decoder is not None, f"no decoder for {event.table}"
        data = row_data(event)
        assert data is not None
        update = isinstance(event, UpdateRowsEvent)
        if update:
            ours = decoder.image_pairs(data, event.columns_present_bitmap,
                                       event.columns_present_bitmap2)
            left_out_seen |= any(old[1] or new[1] for old, new in ours)
        else:
            ours = decoder.images(data, event.columns_present_bitmap)
            left_out_seen |= any(image[1] for image in ours)
        theirs = library_images(plan, event, update)
        assert len(ours) == len(theirs)
        for index, (mine, library) in enumerate(zip(ours, theirs)):
            assert mine == library, f"{event.table} row {index} of a {type(event).__name__}"
        compared[event.table] += len(ours)
    assert compared["types"] >= 4 + 150 + 20 + 50 and compared["more"] >= 150 + 50 + 50
    assert left_out_seen, "the minimal row images left no column out"
    # Every transaction repeats its table's map; each distinct map is parsed once.
    for table in ("types", "more"):
        maps = maps_seen[table]
        assert len(maps) > 100 and len({id(m) for m in maps}) == 1, table
