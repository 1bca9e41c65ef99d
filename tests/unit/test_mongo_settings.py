"""Mongo options -> validated settings -> pymongo client arguments; errors without passwords."""

from __future__ import annotations

import pytest
from pymongo.errors import (ConfigurationError, OperationFailure, ServerSelectionTimeoutError)

from lapidus.workers.base import BackendError
from lapidus.workers.mongo import errors
from lapidus.workers.mongo.settings import MongoSettings, redact_uri


def settings(**options) -> MongoSettings:
    return MongoSettings.from_options("cms", options)


def test_defaults():
    s = settings()
    assert (s.host, s.port, s.database, s.full_document, s.full_document_before_change,
            s.history_lost) == ("127.0.0.1", 27017, None, "updateLookup", "off", "fail")
    target, kwargs = s.client_arguments()
    assert target == "127.0.0.1"
    assert kwargs["port"] == 27017
    assert "username" not in kwargs and "authSource" not in kwargs and "tls" not in kwargs


def test_host_port_credentials_and_replica_set_reach_the_client():
    # The original Lapidus connected to 127.0.0.1 whatever the configuration said.
    target, kwargs = settings(host="db1.example", port=27018, user="lapidus", password="pw",
                              database="cms", replica_set="rs0",
                              auth_source="admin").client_arguments()
    assert target == "db1.example"
    assert (kwargs["port"], kwargs["username"], kwargs["password"], kwargs["authSource"],
            kwargs["replicaSet"]) == (27018, "lapidus", "pw", "admin", "rs0")


def test_uri_is_used_as_given_and_explicit_options_go_on_top():
    uri = "mongodb://lapidus:s3cret@db1:27017,db2:27017/admin?replicaSet=rs0"
    target, kwargs = settings(uri=uri, host=None, port=None, password="other").client_arguments()
    assert target == uri
    assert "port" not in kwargs
    assert kwargs["password"] == "other"


def test_tls_options():
    _, kwargs = settings(tls=True, tls_ca_file="/etc/ca.pem",
                         tls_certificate_key_file="/etc/client.pem",
                         tls_allow_invalid_certificates=False).client_arguments()
    assert (kwargs["tls"], kwargs["tlsCAFile"], kwargs["tlsCertificateKeyFile"],
            kwargs["tlsAllowInvalidCertificates"]) == (True, "/etc/ca.pem", "/etc/client.pem",
                                                       False)


def test_a_ca_file_alone_turns_tls_on():
    _, kwargs = settings(tls_ca_file="/etc/ca.pem").client_arguments()
    assert kwargs["tls"] is True


def test_invalid_options_are_all_reported_at_once():
    with pytest.raises(BackendError) as info:
        settings(full_document="always", full_document_before_change="on",
                 history_lost="skip", port="x", tls="yes")
    message = str(info.value)
    assert info.value.fatal
    for part in ("full_document is 'always'", "'updateLookup'", "full_document_before_change",
                 "history_lost is 'skip'", "'restart_from_now'", "port", "tls must be true"):
        assert part in message


def test_uri_must_be_a_mongodb_uri_and_is_redacted_in_the_error():
    with pytest.raises(BackendError) as info:
        settings(uri="postgres://u:topsecret@h/db")
    assert "topsecret" not in str(info.value)


@pytest.mark.parametrize("uri, expected", [
    ("mongodb://u:p%40ss@h:1/db", "mongodb://u:***@h:1/db"),
    ("mongodb+srv://user:pw@cluster0.example.net/", "mongodb+srv://user:***@cluster0.example.net/"),
    ("mongodb://h1,h2/?replicaSet=rs0", "mongodb://h1,h2/?replicaSet=rs0"),
])
def test_redact_uri(uri, expected):
    assert redact_uri(uri) == expected


class TestErrors:
    def test_wrong_credentials_are_fatal_and_name_user_and_auth_source(self):
        s = settings(host="db1", user="lapidus", password="hunter2", database="cms")
        exc = OperationFailure("Authentication failed.", 18,
                               {"ok": 0, "errmsg": "Authentication failed.", "code": 18})
        err = errors.describe(s, exc, "connecting")
        assert err.fatal
        message = str(err)
        assert 'backend "cms"' in message and "db1:27017" in message
        assert 'user "lapidus"' in message and 'authSource "admin"' in message
        assert "auth_source" in message
        assert "hunter2" not in message

    def test_unreachable_is_transient_and_names_host_and_port(self):
        s = settings(host="db9", port=27999, password="hunter2")
        exc = ServerSelectionTimeoutError(
            "db9:27999: [Errno 111] Connection refused, Timeout: 10.0s, Topology Description: "
            "<TopologyDescription ...>")
        err = errors.describe(s, exc, "connecting")
        assert not err.fatal
        assert "db9:27999" in str(err) and "Connection refused" in str(err)
        assert "Topology Description" not in str(err)

    def test_certificate_problems_are_fatal_with_the_fix(self):
        exc = ServerSelectionTimeoutError("h:1: [SSL: CERTIFICATE_VERIFY_FAILED] certificate "
                                          "verify failed: self signed certificate, Timeout: 1s")
        err = errors.describe(settings(tls=True), exc, "connecting")
        assert err.fatal and "tls_ca_file" in str(err)

    def test_password_inside_a_driver_message_is_redacted(self):
        s = settings(uri="mongodb://u:hunter2@h/", host=None, port=None)
        err = errors.describe(s, ConfigurationError("bad option in mongodb://u:hunter2@h/"),
                              "connecting")
        assert err.fatal and "hunter2" not in str(err)

    def test_not_a_replica_set_names_the_fix(self):
        exc = OperationFailure("The $changeStream stage is only supported on replica sets",
                               40573)
        err = errors.describe(settings(), exc, "opening the change stream")
        assert err.fatal
        for part in ("rs.initiate()", "--replSet", "replica_set"):
            assert part in str(err)

    def test_missing_privilege_names_the_role(self):
        exc = OperationFailure("not authorized on shop to execute command", 13)
        assert '"read" on database "shop"' in str(errors.describe(
            settings(database="shop", user="u"), exc, "opening the change stream"))
        assert "readAnyDatabase" in str(errors.describe(settings(user="u"), exc, "x"))

    def test_required_image_missing_names_collmod(self):
        exc = OperationFailure("Change stream was configured to require a pre-image", 47)
        err = errors.describe(settings(), exc, "reading changes")
        assert err.fatal and "changeStreamPreAndPostImages" in str(err)

    @pytest.mark.parametrize("code, message", [
        (286, "Resume of change stream was not possible, as the resume point may no longer "
              "be in the oplog."),
        (40576, "Resume of change stream was not possible, as the resume point may no longer "
                "be in the oplog."),
        (280, "resume point may no longer be in the oplog"),
    ])
    def test_history_lost_is_recognised(self, code, message):
        assert errors.is_history_lost(OperationFailure(message, code, {"errmsg": message}))

    def test_other_failures_are_not_history_lost(self):
        assert not errors.is_history_lost(OperationFailure("boom", 8000))
        assert not errors.is_history_lost(ValueError("x"))

    def test_history_lost_failure_names_the_option(self):
        err = errors.history_lost(settings(), "8265AB", "resume point gone")
        assert err.fatal
        assert "8265AB" in str(err) and 'history_lost = "restart_from_now"' in str(err)
