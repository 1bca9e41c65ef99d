"""Unit tests: the row image decoder over hand-made row bytes (the comparison with the
library's decoding over a real server's rows is tests/integration/test_mysql_rowimage.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pymysqlreplication.constants import FIELD_TYPE

from lapidus.workers.mysql.rowimage import compile_table

COLUMNS = [SimpleNamespace(type=FIELD_TYPE.LONG, name="id", unsigned=False),
           SimpleNamespace(type=FIELD_TYPE.VARCHAR, name="name", max_length=32,
                           character_set_name="utf8mb4", unsigned=False)]
ROW = b"\x00" + (7).to_bytes(4, "little") + b"\x03abc"        # null bitmap, id, name
NULL_NAME = b"\x02" + (8).to_bytes(4, "little")                 # name NULL: no bytes for it


def test_rows_follow_each_other_and_nulls_take_no_bytes():
    decoder = compile_table(COLUMNS)
    assert decoder.images(ROW + NULL_NAME + ROW, b"\x03") == [
        ({"id": 7, "name": "abc"}, None), ({"id": 8, "name": None}, None),
        ({"id": 7, "name": "abc"}, None)]


def test_a_column_left_out_of_the_image_is_named_not_null():
    decoder = compile_table(COLUMNS)
    only_id = b"\x00" + (9).to_bytes(4, "little")
    assert decoder.images(only_id, b"\x01") == [({"id": 9}, ["name"])]


def test_row_images_that_overrun_the_event_are_an_error_not_short_values():
    decoder = compile_table(COLUMNS)
    with pytest.raises(ValueError, match="table map does not describe"):
        decoder.images(ROW[:-1], b"\x03")                      # name cut short


def test_a_column_without_the_metadata_its_reader_needs_leaves_the_table_to_the_library():
    assert compile_table([SimpleNamespace(type=FIELD_TYPE.VARCHAR, name="v")]) is None
    assert compile_table([SimpleNamespace(type=FIELD_TYPE.JSON, name="j", unsigned=False)]) is None
