"""Events built from recorded change-stream documents, compared whole.

The documents are written in canonical Extended JSON exactly in the shape MongoDB 6.0/7.0 sends
them (field order, ``wallTime``, ``lsid``/``txnNumber`` inside transactions, pre-images, the
DDL events and ``invalidate``), because those are the paths the in-process test server cannot
show or shows differently.  Each goes through BSON and back with the client's codec options, so
the mapper sees the Python types pymongo produces (``Int64`` txnNumber, ``Binary`` subtype 4 lsid,
naive UTC datetimes).  Resume tokens are opaque hex strings of the real form (``8265...``).
"""

from __future__ import annotations

import bson
import orjson
import pytest
from bson import json_util
from bson.codec_options import CodecOptions

from lapidus.events import encode
from lapidus.filters import TableFilter
from lapidus.workers.mongo.changes import ChangeMapper, commit_time, transaction_id
from lapidus.workers.mongo.settings import MongoSettings

_, _KWARGS = MongoSettings(backend="t").client_arguments()
DECODE = CodecOptions(tz_aware=_KWARGS["tz_aware"],
                      datetime_conversion=_KWARGS["datetime_conversion"])


def recorded(text: str) -> dict:
    """A change document as the driver hands it over (Extended JSON -> BSON -> Python)."""
    return bson.decode(bson.encode(json_util.loads(text)), codec_options=DECODE)


def token(n: int) -> str:
    # The shape of a MongoDB 7.0 resume token's _data (KeyString hex: 82 + cluster time ...).
    return f"8265A5B2C3{n:08X}2B042C0100296E5A1004A5093ACB41D24D6A8C3F1E0B5D7E9F21463C5F6964" \
           f"003C65A5B2C3D4E5F60718293A4B000004"


def mapper(include=(), exclude=(), database="shop", backend="cms") -> ChangeMapper:
    return ChangeMapper(backend, TableFilter(include, exclude), database)


def as_json(event) -> dict:
    return orjson.loads(encode(event))


OID = "65a5b2c3d4e5f60718293a4b"

INSERT = recorded(f"""{{
  "_id": {{"_data": "{token(1)}"}},
  "operationType": "insert",
  "clusterTime": {{"$timestamp": {{"t": 1705357987, "i": 1}}}},
  "wallTime": {{"$date": {{"$numberLong": "1705357987295"}}}},
  "fullDocument": {{"_id": {{"$oid": "{OID}"}}, "name": "lamp",
                    "price": {{"$numberDecimal": "19.90"}}, "stock": {{"$numberInt": "3"}},
                    "views": {{"$numberLong": "9007199254740993"}},
                    "tags": ["home", "light"],
                    "added": {{"$date": {{"$numberLong": "1705357987291"}}}}}},
  "ns": {{"db": "shop", "coll": "items"}},
  "documentKey": {{"_id": {{"$oid": "{OID}"}}}}
}}""")


def test_insert():
    assert as_json(mapper().event(INSERT)) == {
        "id": f"cms:{token(1)}:0", "type": "insert", "backend": "cms",
        "schema": "shop", "table": "items", "pk": {"_id": OID},
        "item": {"_id": OID, "name": "lamp", "price": "19.90", "stock": 3,
                 "views": 9007199254740993, "tags": ["home", "light"],
                 "added": "2024-01-15T22:33:07.291Z"},
        "before": None, "position": token(1), "txid": None,
        "ts": "2024-01-15T22:33:07.295Z",
    }


UPDATE_LOOKUP = recorded(f"""{{
  "_id": {{"_data": "{token(2)}"}},
  "operationType": "update",
  "clusterTime": {{"$timestamp": {{"t": 1705357990, "i": 4}}}},
  "wallTime": {{"$date": {{"$numberLong": "1705357990010"}}}},
  "fullDocument": {{"_id": {{"$oid": "{OID}"}}, "name": "lamp",
                    "price": {{"$numberDecimal": "17.50"}},
                    "dims": {{"h": {{"$numberDouble": "NaN"}}}}, "history": [1, 2]}},
  "ns": {{"db": "shop", "coll": "items"}},
  "documentKey": {{"_id": {{"$oid": "{OID}"}}}},
  "updateDescription": {{
    "updatedFields": {{"price": {{"$numberDecimal": "17.50"}},
                       "dims.h": {{"$numberDouble": "NaN"}}}},
    "removedFields": ["promo", "tags"],
    "truncatedArrays": [{{"field": "history", "newSize": {{"$numberInt": "2"}}}}]
  }}
}}""")


def test_update_with_update_lookup_and_update_description():
    assert as_json(mapper().event(UPDATE_LOOKUP)) == {
        "id": f"cms:{token(2)}:0", "type": "update", "backend": "cms",
        "schema": "shop", "table": "items", "pk": {"_id": OID},
        "item": {"_id": OID, "name": "lamp", "price": "17.50", "dims": {"h": "NaN"},
                 "history": [1, 2]},
        "before": {"_id": OID},
        "position": token(2), "txid": None, "ts": "2024-01-15T22:33:10.010Z",
        "update": {"set": {"price": "17.50", "dims.h": "NaN"}, "unset": ["promo", "tags"],
                   "truncated": {"history": 2}},
    }


def test_update_whose_document_is_gone_has_a_null_item():
    # updateLookup runs when the change is read: a document deleted meanwhile is null.
    change = dict(UPDATE_LOOKUP, fullDocument=None)
    change["updateDescription"] = {"updatedFields": {"a": 1}, "removedFields": [],
                                   "truncatedArrays": []}
    event = as_json(mapper().event(change))
    assert event["item"] is None
    assert event["update"] == {"set": {"a": 1}, "unset": []}      # no empty "truncated"


UPDATE_WITH_IMAGES = recorded(f"""{{
  "_id": {{"_data": "{token(3)}"}},
  "operationType": "update",
  "clusterTime": {{"$timestamp": {{"t": 1705358000, "i": 1}}}},
  "wallTime": {{"$date": {{"$numberLong": "1705358000500"}}}},
  "fullDocument": {{"_id": 7, "qty": 2, "sku": "A-1"}},
  "ns": {{"db": "shop", "coll": "stock"}},
  "documentKey": {{"_id": 7}},
  "updateDescription": {{"updatedFields": {{"qty": 2}}, "removedFields": [],
                         "truncatedArrays": []}},
  "fullDocumentBeforeChange": {{"_id": 7, "qty": 5, "sku": "A-1"}}
}}""")


def test_update_with_pre_and_post_images():
    assert as_json(mapper().event(UPDATE_WITH_IMAGES)) == {
        "id": f"cms:{token(3)}:0", "type": "update", "backend": "cms",
        "schema": "shop", "table": "stock", "pk": {"_id": 7},
        "item": {"_id": 7, "qty": 2, "sku": "A-1"},
        "before": {"_id": 7, "qty": 5, "sku": "A-1"},
        "position": token(3), "txid": None, "ts": "2024-01-15T22:33:20.500Z",
        "update": {"set": {"qty": 2}, "unset": []},
    }


REPLACE = recorded(f"""{{
  "_id": {{"_data": "{token(4)}"}},
  "operationType": "replace",
  "clusterTime": {{"$timestamp": {{"t": 1705358001, "i": 2}}}},
  "wallTime": {{"$date": {{"$numberLong": "1705358001000"}}}},
  "fullDocument": {{"_id": 7, "sku": "A-2"}},
  "ns": {{"db": "shop", "coll": "stock"}},
  "documentKey": {{"_id": 7}},
  "fullDocumentBeforeChange": {{"_id": 7, "qty": 2, "sku": "A-1"}}
}}""")


def test_replace_is_a_replace_event_without_an_update_description():
    assert as_json(mapper().event(REPLACE)) == {
        "id": f"cms:{token(4)}:0", "type": "replace", "backend": "cms",
        "schema": "shop", "table": "stock", "pk": {"_id": 7},
        "item": {"_id": 7, "sku": "A-2"}, "before": {"_id": 7, "qty": 2, "sku": "A-1"},
        "position": token(4), "txid": None, "ts": "2024-01-15T22:33:21.000Z",
    }


DELETE = recorded(f"""{{
  "_id": {{"_data": "{token(5)}"}},
  "operationType": "delete",
  "clusterTime": {{"$timestamp": {{"t": 1705358002, "i": 1}}}},
  "wallTime": {{"$date": {{"$numberLong": "1705358002123"}}}},
  "ns": {{"db": "shop", "coll": "stock"}},
  "documentKey": {{"_id": 7}}
}}""")


def test_delete_without_pre_image_carries_the_key_as_before():
    assert as_json(mapper().event(DELETE)) == {
        "id": f"cms:{token(5)}:0", "type": "delete", "backend": "cms",
        "schema": "shop", "table": "stock", "pk": {"_id": 7}, "item": None,
        "before": {"_id": 7}, "position": token(5), "txid": None,
        "ts": "2024-01-15T22:33:22.123Z",
    }


def test_delete_with_pre_image():
    change = dict(DELETE, fullDocumentBeforeChange={"_id": 7, "sku": "A-2"})
    assert as_json(mapper().event(change))["before"] == {"_id": 7, "sku": "A-2"}


def test_pre_image_when_available_but_expired_falls_back_to_the_key():
    change = dict(DELETE, fullDocumentBeforeChange=None)    # whenAvailable, image expired
    assert as_json(mapper().event(change))["before"] == {"_id": 7}


LSID = """{"id": {"$binary": {"base64": "DwytmdnLRp+hZXCGdyiVDg==", "subType": "04"}},
           "uid": {"$binary": {"base64": "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=",
                               "subType": "00"}}}"""

TXN_INSERTS = [recorded(f"""{{
  "_id": {{"_data": "{token(10 + n)}"}},
  "operationType": "insert",
  "clusterTime": {{"$timestamp": {{"t": 1705358100, "i": 3}}}},
  "wallTime": {{"$date": {{"$numberLong": "1705358100042"}}}},
  "fullDocument": {{"_id": {n}, "order": "o-1"}},
  "ns": {{"db": "shop", "coll": "lines"}},
  "documentKey": {{"_id": {n}}},
  "lsid": {LSID},
  "txnNumber": {{"$numberLong": "7"}}
}}""") for n in (1, 2)]


def test_transaction_changes_share_the_txid_and_keep_distinct_ids():
    first, second = (as_json(mapper().event(c)) for c in TXN_INSERTS)
    assert first == {
        "id": f"cms:{token(11)}:0", "type": "insert", "backend": "cms",
        "schema": "shop", "table": "lines", "pk": {"_id": 1},
        "item": {"_id": 1, "order": "o-1"}, "before": None, "position": token(11),
        "txid": "0f0cad99-d9cb-469f-a165-70867728950e:7", "ts": "2024-01-15T22:35:00.042Z",
    }
    assert second["txid"] == first["txid"]
    assert second["ts"] == first["ts"]
    assert second["id"] != first["id"]


def test_txid_needs_both_session_and_number():
    assert transaction_id({"lsid": {"id": 1}}) is None
    assert transaction_id({"txnNumber": 3}) is None
    assert transaction_id(TXN_INSERTS[0]) == "0f0cad99-d9cb-469f-a165-70867728950e:7"


def ddl(kind: str, n: int, ns: str, extra: str = "") -> dict:
    return recorded(f"""{{
      "_id": {{"_data": "{token(n)}"}},
      "operationType": "{kind}",
      "clusterTime": {{"$timestamp": {{"t": 1705358200, "i": {n}}}}},
      "wallTime": {{"$date": {{"$numberLong": "1705358200000"}}}}
      {', "ns": ' + ns if ns else ""}
      {extra}
    }}""")


RENAME = ddl("rename", 20, '{"db": "shop", "coll": "items"}',
             ', "to": {"db": "shop", "coll": "items_2023"}')
DROP = ddl("drop", 21, '{"db": "shop", "coll": "items"}')
DROP_DATABASE = ddl("dropDatabase", 22, '{"db": "shop"}')
INVALIDATE = ddl("invalidate", 23, "")


def schema_event(n: int, table, item, schema="shop") -> dict:
    return {"id": f"cms:{token(n)}:0", "type": "schema", "backend": "cms", "schema": schema,
            "table": table, "pk": None, "item": item, "before": None, "position": token(n),
            "txid": None, "ts": "2024-01-15T22:36:40.000Z"}


def test_rename():
    assert as_json(mapper().event(RENAME)) == schema_event(
        20, "items", {"operation": "rename", "to": {"schema": "shop", "table": "items_2023"}})


def test_drop():
    assert as_json(mapper().event(DROP)) == schema_event(21, "items", {"operation": "drop"})


def test_drop_database():
    assert as_json(mapper().event(DROP_DATABASE)) == \
        schema_event(22, None, {"operation": "dropDatabase"})


def test_invalidate_names_the_watched_database():
    assert as_json(mapper().event(INVALIDATE)) == \
        schema_event(23, None, {"operation": "invalidate"})
    assert as_json(mapper(database=None).event(INVALIDATE))["schema"] is None


def test_expanded_ddl_events_keep_their_description():
    create = ddl("create", 24, '{"db": "shop", "coll": "carts"}',
                 ', "operationDescription": {"idIndex": {"v": 2, "key": {"_id": 1}, '
                 '"name": "_id_"}}')
    assert as_json(mapper().event(create)) == schema_event(
        24, "carts", {"operation": "create",
                      "description": {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}})


def test_whole_deployment_stream_takes_the_schema_from_each_change():
    change = dict(INSERT, ns={"db": "crm", "coll": "people"})
    event = as_json(mapper(database=None).event(change))
    assert (event["schema"], event["table"]) == ("crm", "people")


def test_sharded_document_key_keeps_only_the_id_in_pk():
    change = dict(DELETE, documentKey={"region": "eu", "_id": 7})
    assert as_json(mapper().event(change))["pk"] == {"_id": 7}


def test_without_wall_time_the_cluster_time_seconds_are_used():
    change = dict(INSERT)
    del change["wallTime"]                                  # MongoDB before 6.0
    assert commit_time(change) == "2024-01-15T22:33:07.000Z"


class TestFilter:
    def test_excluded_collection_changes_are_dropped(self):
        m = mapper(exclude=["items"])
        assert m.event(INSERT) is None
        assert m.event(UPDATE_LOOKUP) is None
        assert m.event(DROP) is None
        assert m.event(DELETE) is not None                  # "stock"

    def test_qualified_patterns_match_database_and_collection(self):
        m = mapper(include=["shop.st*"], database=None)
        assert m.event(INSERT) is None
        assert m.event(DELETE) is not None

    def test_rename_passes_when_either_side_is_streamed(self):
        assert mapper(include=["items_2023"]).event(RENAME) is not None
        assert mapper(include=["items"]).event(RENAME) is not None
        assert mapper(exclude=["items", "items_*"]).event(RENAME) is None

    def test_database_wide_events_always_pass(self):
        m = mapper(include=["nothing"])
        assert m.event(DROP_DATABASE) is not None
        assert m.event(INVALIDATE) is not None


@pytest.mark.parametrize("change", [INSERT, UPDATE_LOOKUP, REPLACE, DELETE, RENAME, DROP,
                                    DROP_DATABASE, INVALIDATE] + TXN_INSERTS)
def test_ids_are_deterministic(change):
    assert mapper().event(change) == mapper().event(change)
