"""The declarations of ``[[backends]]`` (the settings every type shares, then those of each
type) and the lookups over them: one type's settings, the keys of the other types."""

from __future__ import annotations

from typing import Dict, List, Tuple

from .kinds import (
    BackendType, Bool, ByteSize, Choice, Globs, Int, MongoUri, PathKind, Pattern, Plugins,
    Seconds, Str,
)
from .names import (
    NAME_RE, SERVER_ID_MAX, SERVER_ID_MIN, SLOT_RE, derived_server_id, pg_identifier,
)
from .setting import UNSET, Derived, Setting

PG, MY, MONGO = ("postgresql",), ("mysql",), ("mongo",)
SQL = ("postgresql", "mysql")

#: seconds; ``batch_linger``'s default (the worker loop's fallback too): the most latency the
#: grouping adds; docs/operations.md, docs/dev/benchmarks.md (Cost per transaction)
BATCH_LINGER = 0.003

BACKEND_COMMON: Tuple[Setting, ...] = (
    Setting("name", Pattern(NAME_RE, 'a name of 1 to 64 letters, digits, "_" or "-"',
                            "name"),
            "Backend name: used in events, NATS headers, metrics, file names.",
            Derived("`<type>_<database>` (`<type>` without a database); `_2`, `_3` ... "
                    "appended when two backends derive the same name", lambda v, c: None)),
    Setting("type", BackendType(), "`postgresql`, `mysql` or `mongo`.", required=True),
    Setting("enabled", Bool(), "A disabled backend is validated but not started.", True),
    Setting("include_tables", Globs(), "Only these tables (globs on `table` or "
            "`schema.table`); empty: every table not excluded.", (),
            aliases=("includeTables",)),
    Setting("exclude_tables", Globs(), "Tables never streamed (globs on `table` or "
            "`schema.table`).", (), aliases=("excludeTables",)),
    Setting("plugins", Plugins(), "This backend's plugins; when given they replace the "
            "global `plugins` for this backend.", UNSET),
    Setting("batch_size", Int(1), "Most events shipped from the worker in one batch.", 1000),
    Setting("batch_linger", Seconds(zero=True), "After a read that found events, how long "
            "the worker waits before it reads again, so that the transactions committed "
            "meanwhile go out as one batch (one delivery, one acknowledgement) instead of one "
            "each: the most latency this adds to an event, and what makes a busy stream of "
            "small transactions cheap. `0`: every read goes out at once.", BATCH_LINGER),
    Setting("max_inflight_batches", Int(1), "Batches sent but not yet confirmed by the "
            "sinks before the worker stops reading (backpressure).", 8),
    Setting("on_undeliverable", Choice("hold", "dead_letter"), "An event a sink refuses for "
            "good (too large, not permitted): `hold` keeps the backend at that event, retrying, "
            "until the cause is fixed (nothing skipped); `dead_letter` moves it to "
            "`<state_dir>/<backend>/dead-letters.jsonl` and streams on.", "hold"),
    Setting("reconnect_max_delay", Seconds(), "Longest wait between two attempts at reaching "
            "an unreachable database; the worker retries for ever (state WAITING, never counted "
            "as a crash), waits doubling from 0.5 s up to this.", 30.0),
    Setting("snapshot", Choice("never", "initial"), "`initial`: on the backend's first start "
            "(no checkpoint yet) read every included table and stream its rows as `read` "
            "events, then go on streaming; resumed after a restart, never repeated. Built for "
            "PostgreSQL (pgoutput), MariaDB (or Percona Server; not Oracle MySQL) and MongoDB "
            "(collections in `_id` chunks); docs/snapshots.md.", "never"),
    Setting("snapshot_chunk_rows", Int(1), "Rows read per snapshot chunk (keyset on the "
            "primary key; `_id` on MongoDB); the worker holds at most one chunk in memory.",
            5000),
    Setting("snapshot_chunk_timeout", Seconds(), "Statement timeout of one chunk's SELECT "
            "(PostgreSQL `statement_timeout`, MariaDB `max_statement_time`, MongoDB "
            "`maxTimeMS` of its `find`), so a chunk never holds locks or a transaction long; a "
            "chunk that needs longer fails the backend (make `snapshot_chunk_rows` smaller).",
            30.0),
)

_PORT = Int(1, 65535)

BACKEND_TYPED: Tuple[Setting, ...] = (
    # shared by several types
    Setting("host", Str(), "Server host name or address.", "127.0.0.1",
            aliases=("hostname",)),
    Setting("password", Str(empty=True), "Password; use `\"${VAR}\"` to keep it out of the "
            "file.", secret=True),
    Setting("connect_timeout", Int(1), "Seconds to wait for one connection attempt.", 10,
            types=SQL),
    # postgresql
    Setting("port", _PORT, "Server port.", 5432, types=PG),
    Setting("user", Str(), "User with the REPLICATION attribute.", "postgres", types=PG,
            aliases=("username",)),
    Setting("passfile", PathKind(), "A libpq password file, instead of `password`.",
            types=PG),
    Setting("database", Str(), "Database to stream (logical decoding is per database).",
            types=PG, required=True),
    Setting("slot", Pattern(SLOT_RE, 'a slot name of 1 to 63 lowercase letters, digits or "_"',
                            "slot name"),
            "Logical replication slot.",
            Derived("`lapidus_<name>`, lowercased, other characters replaced by `_`, "
                    "63 at most", lambda v, c: pg_identifier(v["name"])), types=PG),
    Setting("temporary_slot", Bool(), "Drop the slot when the backend stops (demos, tests); "
            "the next start creates a new one and emits a `gap` event: changes made while "
            "stopped are lost (docs/postgresql.md). Refused in cluster mode.", False, types=PG),
    Setting("decoder", Choice("auto", "pgoutput", "wal2json"),
            "Logical decoding output plugin. `auto`: the plugin of an existing slot, else "
            "`pgoutput` when the server allows it (built in, the default), else `wal2json`. "
            "`pgoutput` keeps NaN and infinities exact and needs a publication; `wal2json` "
            "needs the plugin installed. See docs/postgresql.md.", "auto", types=PG),
    Setting("publication", Str(), "Publication read by the `pgoutput` decoder; set up "
            "before the slot, as `publication_mode` says.",
            Derived("`lapidus_<name>`, made valid like `slot`",
                    lambda v, c: pg_identifier(v["name"])), types=PG),
    Setting("publication_mode", Choice("all_tables", "filtered", "existing"),
            "`all_tables`: create it FOR ALL TABLES if missing (superuser); `filtered`: "
            "create it, or change it, to list the tables that pass include/exclude now "
            "(tables created later need a restart); `existing`: use it as the DBA made it, "
            "never create or change it. Lapidus refuses to publish tables without a primary "
            "key or replica identity (UPDATE/DELETE on them would fail).", "all_tables",
            types=PG),
    Setting("publish_via_partition_root", Bool(), "`pgoutput` only: changes to a "
            "partition arrive as its partitioned parent (table name, subject, snapshot), like "
            "the publication option of that name, which Lapidus sets on a publication it makes "
            "(`existing`: must match). Changes written before a switch keep the old names "
            "(docs/postgresql.md#partitioned-tables).", False, types=PG),
    Setting("messages", Bool(), "Emit `pg_logical_emit_message` calls as `message` events.",
            True, types=PG),
    Setting("sslmode", Choice("disable", "allow", "prefer", "require", "verify-ca",
                              "verify-full"), "libpq `sslmode`; libpq's default when unset. "
            "With `sslrootcert`, use `verify-full` (or `verify-ca`): weaker modes do not "
            "refuse a server without TLS.", types=PG),
    Setting("sslrootcert", PathKind(), "CA certificate(s), PEM, that the server's certificate "
            "must chain to (libpq `sslrootcert`); used by the worker and by `pg_recvlogical`.",
            types=PG),
    Setting("sslcert", PathKind(), "Client certificate, PEM (libpq `sslcert`), for servers "
            "that authenticate clients by certificate.", types=PG),
    Setting("sslkey", PathKind(), "The client certificate's private key (libpq `sslkey`); "
            "libpq refuses it unless its mode is 0600 (or 0640 owned by root).", types=PG),
    Setting("fsync_interval", Seconds(), "How often `pg_recvlogical` fsyncs the spool (and "
            "so confirms the slot). Unused in cluster mode, where the slot confirms what the "
            "sinks acknowledged (docs/cluster.md).", 1.0, types=PG),
    Setting("status_interval", Seconds(), "How often `pg_recvlogical` tells the server how far "
            "it wrote and fsynced (the slot advances that often; the spool holds what it "
            "has not confirmed yet), and so how often an idle `pg_recvlogical` wakes up; "
            "`pg_recvlogical`'s own default. One started again after a pause at "
            "`spool_max_bytes` reports every second. In cluster mode: how often the "
            "replication reader reports what the sinks acknowledged.", 10.0, types=PG),
    Setting("spool_segment_bytes", ByteSize(), "Spool file size at which a new segment starts.",
            64 * 2**20, types=PG),
    Setting("spool_max_bytes", ByteSize(), "Undelivered spool at which `pg_recvlogical` is "
            "paused (WAL then accumulates on the server).", 2**30, types=PG),
    Setting("slot_warn_bytes", ByteSize(), "Warn (log, `lapidusctl status`, metrics) when the "
            "server retains more WAL than this for the replication slot.", 2**30, types=PG),
    Setting("pg_recvlogical", PathKind(search_path=True), "The `pg_recvlogical` binary; a bare "
            "name is looked up on `$PATH`.", types=PG),
    # mysql
    Setting("port", _PORT, "Server port.", 3306, types=MY),
    Setting("user", Str(), "User with REPLICATION SLAVE, REPLICATION CLIENT and SELECT "
            "(`CREATE USER 'lapidus'@'%' IDENTIFIED BY '...'; GRANT REPLICATION SLAVE, "
            "REPLICATION CLIENT, SELECT ON *.* TO 'lapidus'@'%';`). Not `root` by default: "
            "Debian's root logs in by unix socket only, never over TCP.",
            "lapidus", types=MY, aliases=("username",)),
    Setting("database", Str(), "Stream only this database (unless `include_tables` says "
            "otherwise); every database when unset.", types=MY),
    Setting("server_id", Int(SERVER_ID_MIN, SERVER_ID_MAX), "Replica server id; must differ "
            "from the server's and from every other replica's.",
            Derived("a stable number in 1000..4294967295 hashed from this host's "
                    "`/etc/machine-id` (else its host name) and the backend name, so readers "
                    "on different hosts never share one",
                    lambda v, c: derived_server_id(v["name"])), types=MY,
            aliases=("serverId",)),
    Setting("connect_retry_seconds", Seconds(zero=True), "No longer used (accepted so older "
            "files load): an unreachable server is retried for ever, see "
            "`reconnect_max_delay`.", types=MY),
    Setting("heartbeat_seconds", Seconds(), "Heartbeat period asked of the server while its "
            "binlog is quiet, so a dead connection is noticed: a binlog connection silent for "
            "3 times this long (45 s by default) is reopened from the checkpoint, at the latest "
            "10 s after that. Each heartbeat wakes an idle worker.", 15.0, types=MY),
    Setting("allow_partial_row_image", Bool(), "Accept `binlog_row_image` other than FULL "
            "(events then lack unchanged columns).", False, types=MY),
    Setting("flavor", Choice("auto", "mariadb", "mysql"), "Server flavour; `auto` asks the "
            "server.", "auto", types=MY),
    Setting("ssl_ca", PathKind(), "CA certificate(s), PEM, that the server's certificate must "
            "chain to; setting it turns TLS on (for the query connection and the binlog "
            "stream).", types=MY),
    Setting("ssl_cert", PathKind(), "Client certificate, PEM, for servers that require one "
            "(`REQUIRE X509`); turns TLS on.", types=MY),
    Setting("ssl_key", PathKind(), "The client certificate's private key, PEM (needs "
            "`ssl_cert`).", types=MY),
    Setting("ssl_verify", Choice("none", "ca", "identity"), "TLS to the server, and how its "
            "certificate is checked: `identity` (it must chain to `ssl_ca`, or to the system's "
            "CAs without `ssl_ca`, and name `host`), `ca` (the chain only), `none` (encrypted, "
            "unchecked). A server without TLS is refused in every case. Unset: `identity` when "
            "any `ssl_*` file is set, else pymysql's default (TLS when the server offers it, "
            "unchecked, plain otherwise).", types=MY),
    # mongo
    Setting("uri", MongoUri(), "Connection string, instead of host/port/user/password.",
            types=MONGO, secret=True),
    Setting("port", _PORT, "Server port.", 27017, types=MONGO),
    Setting("user", Str(), "User name.", types=MONGO, aliases=("username",)),
    Setting("database", Str(), "Watch only this database; the whole deployment when unset.",
            types=MONGO),
    Setting("replica_set", Str(), "Replica set name.", types=MONGO, aliases=("replicaSet",)),
    Setting("auth_source", Str(), "Database holding the user; the driver's default when "
            "unset.", types=MONGO),
    Setting("tls", Bool(), "Use TLS; the driver's default (or the uri's) when unset.",
            types=MONGO),
    Setting("tls_ca_file", PathKind(), "CA bundle for TLS.", types=MONGO),
    Setting("tls_certificate_key_file", PathKind(), "Client certificate and key for TLS.",
            types=MONGO),
    Setting("tls_allow_invalid_certificates", Bool(), "Skip certificate checks (testing "
            "only); the driver's default when unset.", types=MONGO),
    Setting("full_document", Choice("updateLookup", "whenAvailable", "required"),
            "`fullDocument` of the change stream (the row after an update).", "updateLookup",
            types=MONGO),
    Setting("full_document_before_change", Choice("off", "whenAvailable", "required"),
            "`fullDocumentBeforeChange` (needs MongoDB 6.0+ pre-images).", "off",
            types=MONGO),
    Setting("history_lost", Choice("fail", "restart_from_now"), "When the resume token is "
            "no longer in the oplog: stop with an error, or restart from now (skipping "
            "changes, loudly).", "fail", types=MONGO),
    Setting("snapshot_watermarks", Str(), "Collection (`collection` in `database`, or "
            "`database.collection`, inside what the backend watches) where snapshots and "
            "backfills write their chunk watermarks (one document per backend; needs insert "
            "and update on it); its changes are never events. docs/snapshots.md.",
            Derived("`lapidus_watermarks` in `database`; `lapidus.lapidus_watermarks` for "
                    "the whole deployment", lambda v, c: None), types=MONGO),
)


# Connection settings lead each type's table (and its options dict); the rest keep their order.
_LEADING = ("uri", "host", "port", "user", "password")


def backend_settings(backend_type: str) -> Tuple[Setting, ...]:
    """The settings of one backend type, common ones first."""
    own = [s for s in BACKEND_TYPED if backend_type in s.types]
    own.sort(key=lambda s: _LEADING.index(s.name) if s.name in _LEADING else len(_LEADING))
    return BACKEND_COMMON + tuple(own)


def backend_keys_elsewhere(backend_type: str) -> Dict[str, Tuple[str, ...]]:
    """Keys (names and aliases) valid for other backend types only -> those types.

    Lets the validator say "not a mysql setting (slot applies to postgresql backends)"
    instead of a bare "unknown key"."""
    own = {k for s in backend_settings(backend_type) for k in (s.name, *s.aliases)}
    found: Dict[str, List[str]] = {}
    for s in BACKEND_TYPED:
        for key in (s.name, *s.aliases):
            if key not in own:
                found.setdefault(key, [])
                found[key] += [t for t in s.types if t not in found[key]]
    return {k: tuple(v) for k, v in found.items()}


def all_backend_keys() -> Tuple[str, ...]:
    keys = {k for s in BACKEND_COMMON + BACKEND_TYPED for k in (s.name, *s.aliases)}
    return tuple(sorted(keys))
