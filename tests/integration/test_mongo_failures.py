"""MongoSource failures phrased for the operator, on servers broken on purpose.

Each test starts its own SecantusDB (standalone, tiny oplog, authentication, TLS): these
conditions cannot be created on a shared deployment, so they run even with
``LAPIDUS_TEST_MONGO_URI`` set.
"""

from __future__ import annotations

import pymongo
import pytest

from lapidus.workers.base import BackendError
from lapidus.workers.mongo import settings as mongo_settings
from tests.integration.mongo_fixtures import (Pump, free_port, make_tls_files,  # noqa: F401
                                              mongo, options_for, secantus_factory, sources)


@pytest.fixture
def quick_timeouts(monkeypatch):
    """Fail fast where the production timeouts would wait 10 s for a server."""
    monkeypatch.setattr(mongo_settings, "SERVER_SELECTION_TIMEOUT_MS", 1000)
    monkeypatch.setattr(mongo_settings, "CONNECT_TIMEOUT_MS", 1000)


def address(server) -> dict:
    host, port = server.address
    return {"host": host, "port": port}


def test_unreachable_server_is_a_transient_error_naming_host_and_port(sources, quick_timeouts):
    port = free_port()
    source = sources({"host": "127.0.0.1", "port": port, "user": "lapidus",
                      "password": "hunter2", "database": "shop"})
    with pytest.raises(BackendError) as info:
        source.open(None)
    assert not info.value.fatal
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "cannot reach" in message
    assert "hunter2" not in message


def test_wrong_password_is_fatal_and_does_not_show_it(secantus_factory, sources):
    server = secantus_factory()
    admin = pymongo.MongoClient(server.uri)
    admin.admin.command("createUser", "lapidus", pwd="right-horse", roles=["readAnyDatabase"])
    admin.close()
    server.require_auth = True          # read per connection: every new one must authenticate

    source = sources(dict(address(server), user="lapidus", password="battery-staple",
                          database="shop"))
    with pytest.raises(BackendError) as info:
        source.open(None)
    message = str(info.value)
    assert info.value.fatal
    assert 'user "lapidus"' in message and 'authSource "admin"' in message
    assert "battery-staple" not in message and "right-horse" not in message

    # The same options with the right password stream.
    source = sources(dict(address(server), user="lapidus", password="right-horse",
                          database="shop"), state="ok")
    pump = Pump(source, source.state_dir).open()
    writer = pymongo.MongoClient(server.uri, username="lapidus", password="right-horse")
    with pytest.raises(pymongo.errors.OperationFailure):
        writer.shop.items.insert_one({"_id": 1})        # read-only role: just proves auth is on
    writer.close()
    pump.step()


def test_missing_privilege_is_fatal_and_names_the_role(secantus_factory, sources):
    server = secantus_factory()
    admin = pymongo.MongoClient(server.uri)
    admin.shop.command("createUser", "narrow", pwd="pw", roles=["read"])
    admin.close()
    server.require_auth = True
    source = sources(dict(address(server), user="narrow", password="pw", auth_source="shop"))
    with pytest.raises(BackendError) as info:
        source.open(None)                               # no database: the whole deployment
    assert info.value.fatal and "readAnyDatabase" in str(info.value)


def test_standalone_server_is_refused_with_the_replica_set_fix(secantus_factory, sources):
    server = secantus_factory(replica_set_name=None)
    source = sources(dict(address(server), database="shop"))
    with pytest.raises(BackendError) as info:
        source.open(None)
    message = str(info.value)
    assert info.value.fatal
    assert "not a replica set" in message
    assert "rs.initiate()" in message and "--replSet" in message


def test_wrong_replica_set_name_is_reported(secantus_factory, sources, quick_timeouts):
    server = secantus_factory()
    source = sources(dict(address(server), replica_set="rs-other", database="shop"))
    with pytest.raises(BackendError) as info:
        source.open(None)
    assert not info.value.fatal
    assert 'replica set "rs-other"' in str(info.value) and "rs.conf()" in str(info.value)


def truncated_oplog_checkpoint(server, sources, tmp_path, **options):
    """Deliver one change, stop, write 30 more, prune the oplog past the saved position."""
    client = pymongo.MongoClient(server.uri)
    pump = Pump(sources(dict(address(server), database="shop")), tmp_path / "state").open()
    client.shop.items.insert_one({"_id": 0})
    pump.until_count(1)
    pump.source.close()
    client.shop.items.insert_many([{"_id": n} for n in range(1, 31)])
    assert server.storage.prune_oplog() > 0
    client.shop.items.insert_one({"_id": "after"})
    client.close()
    return Pump(sources(dict(address(server), database="shop", **options), state="state"),
                tmp_path / "state")


def test_history_lost_fails_by_default_naming_the_option(secantus_factory, sources, tmp_path):
    server = secantus_factory(oplog_max_entries=10)
    pump = truncated_oplog_checkpoint(server, sources, tmp_path)
    saved = pump.store.load()["position"]
    with pytest.raises(BackendError) as info:
        pump.open()
    message = str(info.value)
    assert info.value.fatal
    assert saved in message and "ChangeStreamHistoryLost" in message
    assert 'history_lost = "restart_from_now"' in message
    assert pump.store.load()["position"] == saved       # nothing moved on silently


def test_history_lost_with_restart_from_now_delivers_a_gap_then_goes_on(
        secantus_factory, sources, tmp_path):
    server = secantus_factory(oplog_max_entries=10)
    pump = truncated_oplog_checkpoint(server, sources, tmp_path, history_lost="restart_from_now")
    lost_after = pump.store.load()["position"]
    pump.open()
    [gap] = pump.until_count(1)
    assert gap.type == "gap" and gap.schema == "shop"
    assert gap.item["reason"] == "history_lost" and gap.item["lost_after"] == lost_after
    assert gap.item["resumed_at"] == gap.position == pump.store.load()["position"]
    assert gap.id == f"cms:{gap.position}:0"

    client = pymongo.MongoClient(server.uri)
    client.shop.items.insert_one({"_id": "next"})
    client.close()
    events = pump.until_count(2)
    assert (events[1].type, events[1].pk) == ("insert", {"_id": "next"})


def test_required_pre_image_without_images_is_fatal_with_collmod(mongo, sources, tmp_path):
    mongo.require_version(6, "changeStreamPreAndPostImages")
    mongo.db.items.insert_one({"_id": 1})
    pump = Pump(sources(options_for(mongo, full_document_before_change="required")),
                tmp_path / "state").open()
    mongo.db.items.update_one({"_id": 1}, {"$set": {"a": 1}})
    with pytest.raises(BackendError) as info:
        pump.until_count(1)
    assert info.value.fatal and "changeStreamPreAndPostImages" in str(info.value)


def test_tls_with_the_ca_file(secantus_factory, sources, tmp_path, quick_timeouts):
    files = make_tls_files(tmp_path / "tls")
    server = secantus_factory(tls_cert_file=files["cert"], tls_key_file=files["key"])
    pump = Pump(sources(dict(address(server), database="shop", tls_ca_file=files["ca"])),
                tmp_path / "state").open()
    client = pymongo.MongoClient(server.uri, tls=True, tlsCAFile=files["ca"])
    client.shop.items.insert_one({"_id": 1})
    client.close()
    assert [e.pk for e in pump.until_count(1)] == [{"_id": 1}]

    untrusted = sources(dict(address(server), database="shop", tls=True), state="untrusted")
    with pytest.raises(BackendError) as info:
        untrusted.open(None)
    assert info.value.fatal and "tls_ca_file" in str(info.value)
