"""Choosing the decoder (``decoder = "auto"``) and reading output_plugin_libraries, no server."""

from __future__ import annotations

import pytest

from lapidus.workers.base import BackendError
from lapidus.workers.postgresql.checks import choose_decoder, parse_identifier_list


class FakeConn:
    """Answers the two queries choose_decoder makes: the slot, and output_plugin_libraries."""

    def __init__(self, slot_plugin=None, plugins="pgoutput, test_decoding, wal2json"):
        self.slot_plugin = slot_plugin
        self.plugins = plugins

    def cursor(self):
        return FakeCursor(self)


class FakeCursor:
    def __init__(self, conn):
        self.conn = conn
        self.row = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def execute(self, sql, args=()):
        if "pg_replication_slots" in sql:
            plugin = self.conn.slot_plugin
            self.row = None if plugin is None else (plugin, "db", False, None, "reserved", "0/1")
        elif "output_plugin_libraries" in sql:
            self.row = None if self.conn.plugins is None else (self.conn.plugins,)
        else:
            raise AssertionError(sql)

    def fetchone(self):
        return self.row


def choose(conn, configured="auto"):
    return choose_decoder(conn, backend="shop", slot="lapidus_shop", configured=configured)


def test_explicit_decoder_is_used_as_configured():
    assert choose(FakeConn(plugins=""), "wal2json") == "wal2json"
    assert choose(FakeConn(plugins=""), "pgoutput") == "pgoutput"


def test_auto_prefers_pgoutput():
    assert choose(FakeConn()) == "pgoutput"


def test_auto_on_a_server_without_the_setting_is_pgoutput():
    assert choose(FakeConn(plugins=None)) == "pgoutput"


def test_auto_falls_back_to_wal2json_when_only_it_is_allowed():
    assert choose(FakeConn(plugins="wal2json, test_decoding")) == "wal2json"


def test_auto_keeps_the_plugin_of_an_existing_slot():
    # a running wal2json installation must not switch decoders on upgrade
    assert choose(FakeConn(slot_plugin="wal2json")) == "wal2json"
    assert choose(FakeConn(slot_plugin="pgoutput", plugins="wal2json")) == "pgoutput"


def test_auto_with_a_slot_of_another_plugin_is_a_fatal_error():
    with pytest.raises(BackendError, match="test_decoding plugin, which Lapidus cannot decode") \
            as err:
        choose(FakeConn(slot_plugin="test_decoding"))
    assert err.value.fatal
    assert "pg_drop_replication_slot('lapidus_shop')" in str(err.value)


def test_server_allowing_neither_gets_one_error_with_the_alter_system_list():
    with pytest.raises(BackendError) as err:
        choose(FakeConn(plugins="test_decoding"))
    message = str(err.value)
    assert err.value.fatal
    assert "allows neither pgoutput nor wal2json" in message
    assert "output_plugin_libraries = 'test_decoding'" in message
    assert ("ALTER SYSTEM SET output_plugin_libraries = 'pgoutput', 'test_decoding', "
            "'wal2json'; SELECT pg_reload_conf();") in message


def test_one_quoted_string_is_one_bogus_entry_that_allows_nothing():
    # ALTER SYSTEM SET output_plugin_libraries = 'pgoutput, wal2json' stores ONE name
    bogus = '"pgoutput, test_decoding, wal2json"'
    assert parse_identifier_list(bogus) == ["pgoutput, test_decoding, wal2json"]
    with pytest.raises(BackendError) as err:
        choose(FakeConn(plugins=bogus))
    # the fix lists each name on its own, and does not repeat the bogus entry
    assert str(err.value).count("'pgoutput'") == 1
    assert "'pgoutput, test_decoding, wal2json'" not in str(err.value).split("ALTER SYSTEM")[1]


def test_other_allowed_plugins_are_kept_in_the_fix():
    with pytest.raises(BackendError) as err:
        choose(FakeConn(plugins="decoderbufs"))
    assert "= 'pgoutput', 'test_decoding', 'wal2json', 'decoderbufs';" in str(err.value)


@pytest.mark.parametrize("text, names", [
    ("pgoutput, test_decoding, wal2json", ["pgoutput", "test_decoding", "wal2json"]),
    ("pgoutput,wal2json", ["pgoutput", "wal2json"]),
    ("", []),
    ("  PgOutput ", ["pgoutput"]),
    ('"Odd""Name", x', ['Odd"Name', "x"]),
])
def test_parse_identifier_list(text, names):
    assert parse_identifier_list(text) == names


# -- pg_recvlogical's death by a missing publication ------------------------------------------

RECVLOGICAL_LOG = (
    'pg_recvlogical: error: unexpected termination of replication stream: ERROR:  publication '
    '"lapidus_pg" does not exist\n'
    'CONTEXT:  slot "s1", output plugin "pgoutput", in the change callback, associated LSN '
    '0/9A952830\n'
    "pg_recvlogical: error: disconnected\n")


def test_missing_publication_in_pg_recvlogical_log_is_explained_with_the_fix():
    from lapidus.workers.postgresql.publications import explain_child_error
    message = explain_child_error(RECVLOGICAL_LOG, backend="pg", slot="s1")
    assert message.startswith('backend "pg": pg_recvlogical stopped: publication "lapidus_pg" '
                              'does not exist')
    assert "SELECT pg_replication_slot_advance('s1', pg_current_wal_lsn());" in message
    assert "CREATE PUBLICATION" in message


def test_other_pg_recvlogical_deaths_are_not_explained_as_publications():
    from lapidus.workers.postgresql.publications import explain_child_error
    assert explain_child_error("pg_recvlogical: error: could not connect\n", backend="pg",
                               slot="s1") is None


def test_auto_before_postgresql_10_is_wal2json():
    conn = FakeConn(plugins=None)
    conn.server_version = 90624
    assert choose(conn) == "wal2json"
