"""Resume tokens as positions and checkpoints."""

from __future__ import annotations

import orjson
import pytest
from bson.binary import Binary

from lapidus.workers.mongo.position import (ResumePoint, parse_checkpoint, token_position,
                                            token_to_json)

HEX = "8265A5B2C3000000012B042C0100296E5A1004A5093ACB41D24D6A8C3F1E0B5D7E9F21463C5F696400"


def test_position_is_the_data_hex():
    assert token_position({"_data": HEX}) == HEX


def test_checkpoint_is_json_and_round_trips():
    point = ResumePoint({"_data": HEX})
    checkpoint = point.to_checkpoint()
    assert checkpoint == {"position": HEX, "resume_token": {"_data": HEX}, "start_after": False}
    assert parse_checkpoint(orjson.loads(orjson.dumps(checkpoint))) == point


def test_start_after_survives_the_round_trip():
    point = ResumePoint({"_data": HEX}, start_after=True)
    assert parse_checkpoint(point.to_checkpoint()) == point


def test_a_bare_token_is_accepted():
    assert parse_checkpoint({"_data": HEX}) == ResumePoint({"_data": HEX})


def test_tokens_of_other_shapes_round_trip_losslessly():
    # MongoDB 3.6 / 4.0 (featureCompatibilityVersion 3.6) sent BinData _data.
    token = {"_data": Binary(b"\x82\x65\xa5", 0), "_typeBits": Binary(b"\x01", 0)}
    as_json = token_to_json(token)
    assert orjson.loads(orjson.dumps(as_json)) == as_json
    point = parse_checkpoint({"resume_token": as_json, "start_after": False})
    assert point.token == {"_data": b"\x82\x65\xa5", "_typeBits": b"\x01"}
    assert token_position(token).startswith('{"_data":{"$binary"')


@pytest.mark.parametrize("bad", [None, "8265", 5, {"resume_token": "8265"},
                                 {"resume_token": {"x": 1}},
                                 {"resume_token": {"_data": HEX}, "start_after": "yes"},
                                 {"lsn": "0/1"}])
def test_malformed_checkpoints_are_rejected(bad):
    with pytest.raises(ValueError):
        parse_checkpoint(bad)
