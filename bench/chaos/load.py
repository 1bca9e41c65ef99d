"""The load: one writer per table, inserts/updates/deletes, and the ledger of what committed.

Each backend gets a table ``chaos_rows (id int primary key, version int, pad text)``.  A key is
inserted with version 1, every update sets ``version = previous + 1``, a delete ends the key; a
key is never inserted again.  So the versions of one key are 1, 2, 3 ... in commit order and a
delete is its last change: per-key order can be checked from the events alone.

The ledger holds a change only once the database committed it:

* COMMIT returned: committed.
* Any error after BEGIN (connection cut, server restarting, COMMIT sent but its answer lost):
  the writer reconnects, waits until the server has finished with the old session (PostgreSQL:
  ``txid_status`` of the transaction is no longer "in progress"; MariaDB: the old connection id
  left the process list, or the server restarted), then reads back the rows the transaction
  touched.  All at their after-values: committed; all at their before-values: not committed;
  anything else is a :class:`LedgerError` (the ledger would not be exact) and stops the run.

The writer is the only one writing its table, so its own view of the rows is the table's.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

import psycopg2
import pymysql

from . import servers
from .waiting import ChaosTimeout, hold, wait_for

TABLE = "chaos_rows"
FENCE_TABLE = "chaos_fence"
RECONNECT_TIMEOUT = 180.0     # a database restart must be over by then


class LedgerError(Exception):
    """The database's state contradicts the ledger: the check would be meaningless."""


class Change(NamedTuple):
    backend: str
    key: int
    type: str          # insert / update / delete
    version: int       # the row's version after the change; the deleted version for a delete
    tx: int            # the writer's transaction number
    oversized: bool = False   # its event exceeds the NATS max_payload: for the dead letters


class Op(NamedTuple):
    type: str
    key: int
    version: int       # after the change (delete: the version deleted)
    oversized: int = 0  # bytes of padding that make its event too large for NATS (0: normal)


@dataclass
class LoadStats:
    transactions: int = 0          # committed, COMMIT answered
    resolved_committed: int = 0    # answer lost, the database says committed
    resolved_rolled_back: int = 0  # error after BEGIN, the database says not committed
    reconnects: int = 0
    errors: Dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"transactions": self.transactions, "resolved_committed": self.resolved_committed,
                "resolved_rolled_back": self.resolved_rolled_back,
                "reconnects": self.reconnects, "errors": dict(self.errors)}


class Ledger:
    """Every committed change, in commit order per backend; thread-safe; also kept on disk
    (one JSON line per change) so a failed run can be examined afterwards."""

    def __init__(self, path: Optional[Path] = None):
        self._lock = threading.Lock()
        self.changes: Dict[str, List[Change]] = {}
        self._file = open(path, "a", encoding="utf-8") if path else None

    def record(self, changes: List[Change]) -> None:
        with self._lock:
            for change in changes:
                self.changes.setdefault(change.backend, []).append(change)
            if self._file is not None:
                self._file.write("".join(json.dumps(c._asdict()) + "\n" for c in changes))
                self._file.flush()

    def last(self, backend: str, deliverable: bool = False) -> Optional[Change]:
        """The newest change of ``backend``; with ``deliverable``, the newest that the stream
        can hold (not oversized)."""
        with self._lock:
            for change in reversed(self.changes.get(backend, ())):
                if not (deliverable and change.oversized):
                    return change
            return None

    def count(self, backend: Optional[str] = None) -> int:
        with self._lock:
            if backend is not None:
                return len(self.changes.get(backend, ()))
            return sum(len(c) for c in self.changes.values())

    def snapshot(self) -> Dict[str, List[Change]]:
        with self._lock:
            return {name: list(changes) for name, changes in self.changes.items()}

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TableLoad(threading.Thread):
    """One writer thread; subclasses speak PostgreSQL or MariaDB."""

    db_errors: Tuple[type, ...] = ()

    def __init__(self, backend: str, database: str, ledger: Ledger, seed: int, rate: float,
                 target_rows: int = 500, big_tx_share: float = 0.03):
        super().__init__(daemon=True, name=f"load-{backend}")
        self.backend = backend
        self.database = database
        self.ledger = ledger
        self.rng = random.Random(seed)
        self.rate = rate
        self.target_rows = target_rows
        self.big_tx_share = big_tx_share
        self.stats = LoadStats()
        self.stop_event = threading.Event()
        self.failure: Optional[BaseException] = None
        self.live: Dict[int, int] = {}          # committed rows: key -> version
        self._keys: List[int] = []              # the same keys, for a uniform random choice
        self._index: Dict[int, int] = {}
        self.next_key = 1
        self.tx = 0
        self.conn = None
        self.session = None
        self._oversized_lock = threading.Lock()
        self._oversized_wanted = 0              # pad bytes of the next oversized insert
        self.oversized: List[Change] = []       # committed oversized inserts

    # -- oversized rows (the dead_letter fault) ----------------------------------------------

    def request_oversized(self, pad_bytes: int) -> int:
        """Ask for one insert with ``pad_bytes`` of padding in the next transaction (among its
        other changes); returns how many oversized inserts had committed before, for
        :meth:`oversized_after`.  Its key is never updated or deleted afterwards: with the
        whole old row in ``before`` every later change of it would be oversized too."""
        with self._oversized_lock:
            self._oversized_wanted = pad_bytes
            return len(self.oversized)

    def oversized_after(self, count: int) -> Optional[Change]:
        """The oversized insert that committed after the first ``count`` ones, if any yet."""
        with self._oversized_lock:
            return self.oversized[count] if len(self.oversized) > count else None

    def _take_oversized(self) -> int:
        with self._oversized_lock:
            wanted, self._oversized_wanted = self._oversized_wanted, 0
            return wanted

    def _oversized_lost(self, ops: List[Op]) -> None:
        """The transaction did not commit: ask again for its oversized insert."""
        for op in ops:
            if op.oversized:
                with self._oversized_lock:
                    self._oversized_wanted = self._oversized_wanted or op.oversized

    # -- database specifics ------------------------------------------------------------------

    def connect(self):
        raise NotImplementedError

    def open_session(self, conn):
        """Identify the session (to know later when the server has finished with it)."""
        raise NotImplementedError

    def begin(self, cur) -> Optional[int]:
        raise NotImplementedError

    def session_finished(self, conn, session, xid: Optional[int]) -> bool:
        raise NotImplementedError

    def read_rows(self, conn, keys: List[int]) -> Dict[int, int]:
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, version FROM {TABLE} WHERE id IN "
                        f"({', '.join(str(int(k)) for k in keys)})")
            return {int(k): int(v) for k, v in cur.fetchall()}

    # -- the loop ------------------------------------------------------------------------------

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> None:
        next_at = time.monotonic()
        try:
            while not self.stop_event.is_set():
                self.one_transaction(self.plan())
                next_at = max(next_at + 1.0 / self.rate, time.monotonic() - 1.0)
                hold(next_at - time.monotonic(), self.stop_event.is_set)   # the load's pace
        except BaseException as exc:
            self.failure = exc
        finally:
            self._drop_connection()

    def plan(self) -> List[Op]:
        """The operations of the next transaction (not executed yet)."""
        rng = self.rng
        roll = rng.random()
        if roll < self.big_tx_share:
            count = rng.randint(20, 120)       # several batches' worth of one transaction
        elif roll < 0.5:
            count = 1
        else:
            count = rng.randint(2, 6)
        overlay: Dict[int, Optional[int]] = {}  # key -> version in this tx (None: deleted)
        inserted: List[int] = []
        ops: List[Op] = []
        for _ in range(count):
            alive = len(self.live) + len(inserted)
            if alive < 20:
                weights = (0.8, 0.15, 0.05)
            elif alive > self.target_rows:
                weights = (0.2, 0.45, 0.35)
            else:
                weights = (0.35, 0.45, 0.2)
            kind = rng.choices(("insert", "update", "delete"), weights)[0]
            key = None
            if kind != "insert":
                key = self._pick(overlay, inserted)
                if key is None:
                    kind = "insert"
            if kind == "insert":
                key = self.next_key
                self.next_key += 1
                overlay[key] = 1
                inserted.append(key)
                ops.append(Op("insert", key, 1))
                continue
            version = overlay[key] if key in overlay else self.live[key]
            if kind == "update":
                overlay[key] = version + 1
                ops.append(Op("update", key, version + 1))
            else:
                overlay[key] = None
                ops.append(Op("delete", key, version))
        oversized = self._take_oversized()
        if oversized:
            key = self.next_key
            self.next_key += 1
            ops.insert(rng.randint(0, len(ops)), Op("insert", key, 1, oversized))
        return ops

    def _pick(self, overlay: Dict[int, Optional[int]], inserted: List[int]) -> Optional[int]:
        rng = self.rng
        for _ in range(5):
            if inserted and (not self._keys or rng.random() < 0.2):
                key = rng.choice(inserted)
            elif self._keys:
                key = rng.choice(self._keys)
            else:
                return None
            if overlay.get(key, 0) is not None:
                return key
        return None

    def one_transaction(self, ops: List[Op]) -> None:
        self.tx += 1
        xid = None
        try:
            if self.conn is None:
                self._reconnect()
            with self.conn.cursor() as cur:
                xid = self.begin(cur)
                for op in ops:
                    self.execute(cur, op)
            self.conn.commit()
        except self.db_errors as exc:
            self._count_error(exc)
            self._resolve(ops, xid)
            return
        self.stats.transactions += 1
        self._apply(ops)

    def execute(self, cur, op: Op) -> None:
        pad = "p" * self.rng.randint(8, 160) if not op.oversized else "O" * op.oversized
        if op.type == "insert":
            cur.execute(f"INSERT INTO {TABLE} (id, version, pad) VALUES (%s, %s, %s)",
                        (op.key, op.version, pad))
        elif op.type == "update":
            cur.execute(f"UPDATE {TABLE} SET version = %s, pad = %s WHERE id = %s "
                        f"AND version = %s", (op.version, pad, op.key, op.version - 1))
        else:
            cur.execute(f"DELETE FROM {TABLE} WHERE id = %s AND version = %s",
                        (op.key, op.version))
        if cur.rowcount != 1:
            raise LedgerError(f"{self.backend}: {op} changed {cur.rowcount} rows; the table "
                              f"and the writer's view of it differ")

    def _apply(self, ops: List[Op]) -> None:
        for op in ops:
            if op.oversized:
                continue          # never touched again (see request_oversized)
            if op.type == "delete":
                self._forget(op.key)
            else:
                self._remember(op.key, op.version)
        changes = [Change(self.backend, op.key, op.type, op.version, self.tx, bool(op.oversized))
                   for op in ops]
        self.ledger.record(changes)
        with self._oversized_lock:
            self.oversized.extend(c for c in changes if c.oversized)

    def _remember(self, key: int, version: int) -> None:
        if key not in self.live:
            self._index[key] = len(self._keys)
            self._keys.append(key)
        self.live[key] = version

    def _forget(self, key: int) -> None:
        del self.live[key]
        index = self._index.pop(key)
        last = self._keys.pop()
        if last != key:
            self._keys[index] = last
            self._index[last] = index

    # -- errors: find out from the database ------------------------------------------------------

    def _count_error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.stats.errors[name] = self.stats.errors.get(name, 0) + 1

    def _drop_connection(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = None

    def _reconnect(self) -> None:
        self._drop_connection()

        def attempt():
            conn = self.connect()
            try:
                session = self.open_session(conn)
            except BaseException:
                conn.close()
                raise
            return conn, session
        self.conn, self.session = wait_for(attempt, RECONNECT_TIMEOUT,
                                           f"{self.backend}: a connection to the database",
                                           interval=0.2)
        self.stats.reconnects += 1

    def _resolve(self, ops: List[Op], xid: Optional[int]) -> None:
        """After an error inside a transaction: did it commit?  Asks the database."""
        old_session = self.session
        before: Dict[int, Optional[int]] = {}
        after: Dict[int, Optional[int]] = {}
        for op in ops:
            before.setdefault(op.key, self.live.get(op.key))
            after[op.key] = None if op.type == "delete" else op.version
        keys = sorted(after)

        def settled():
            if self.conn is None:
                self._reconnect()
            try:
                if old_session is not None and not self.session_finished(
                        self.conn, old_session, xid):
                    return None
                return (self.read_rows(self.conn, keys),)
            except self.db_errors:
                self._drop_connection()
                raise
        try:
            (rows,) = wait_for(settled, RECONNECT_TIMEOUT,
                               f"{self.backend}: the outcome of transaction {self.tx}",
                               interval=0.1)
        except ChaosTimeout as exc:
            raise LedgerError(str(exc)) from None
        seen = {key: rows.get(key) for key in keys}
        if seen == after:
            self.stats.resolved_committed += 1
            self._apply(ops)
        elif seen == before:
            self.stats.resolved_rolled_back += 1
            self._oversized_lost(ops)
        else:
            raise LedgerError(f"{self.backend}: transaction {self.tx} is neither committed nor "
                              f"rolled back: rows {seen}, before {before}, after {after}")


class PgLoad(TableLoad):
    db_errors = (psycopg2.Error,)

    def connect(self):
        return servers.pg_connect(self.database, autocommit=False)

    def open_session(self, conn):
        with conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            pid = cur.fetchone()[0]
        conn.commit()
        return pid

    def begin(self, cur) -> Optional[int]:
        cur.execute("SELECT txid_current()")      # assigns the transaction id now
        return int(cur.fetchone()[0])

    def session_finished(self, conn, session, xid: Optional[int]) -> bool:
        with conn.cursor() as cur:
            if xid is not None:
                cur.execute("SELECT txid_status(%s)", (xid,))
                status = cur.fetchone()[0]
                conn.commit()
                return status != "in progress"
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (session,))
            gone = cur.fetchone()[0] == 0
        conn.commit()
        return gone

    def read_rows(self, conn, keys: List[int]) -> Dict[int, int]:
        rows = super().read_rows(conn, keys)
        conn.commit()
        return rows


class MariaLoad(TableLoad):
    db_errors = (pymysql.err.MySQLError,)

    def connect(self):
        return servers.mysql_connect(self.database, autocommit=False)

    def open_session(self, conn):
        with conn.cursor() as cur:
            cur.execute("SELECT CONNECTION_ID(), UNIX_TIMESTAMP() - VARIABLE_VALUE FROM "
                        "information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'")
            connection_id, booted = cur.fetchone()
        conn.commit()
        return int(connection_id), float(booted)

    def begin(self, cur) -> Optional[int]:
        cur.execute("BEGIN")
        return None

    def session_finished(self, conn, session, xid: Optional[int]) -> bool:
        connection_id, booted = session
        current_id, now_booted = self.open_session(conn)
        if abs(now_booted - booted) > 2:
            return True            # the server restarted: the old session is over
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s",
                        (connection_id,))
            gone = cur.fetchone()[0] == 0
        conn.commit()
        return gone or current_id == connection_id

    def read_rows(self, conn, keys: List[int]) -> Dict[int, int]:
        rows = super().read_rows(conn, keys)
        conn.commit()
        return rows


class Bystander(threading.Thread):
    """Writes to a table of the same layout in another MariaDB database, outside the backend's
    scope: real servers are shared.  Its rows have negative keys, so an event of it that
    reaches the stream (taken for an in-scope table) shows as a phantom.  After a server
    restart it competes with the load for the first table ids of the new binlog file."""

    def __init__(self, database: str, seed: int, rate: float):
        super().__init__(daemon=True, name="bystander")
        self.database = database
        self.rng = random.Random(seed)
        self.rate = rate
        self.stop_event = threading.Event()
        self.writes = 0
        self.errors = 0
        self.once = -10_000_000

    def stop(self) -> None:
        self.stop_event.set()

    def write_once(self) -> None:
        """One row right now, on a new connection (keys below -10,000,000: no collision)."""
        self.once -= 1
        key = self.once

        def attempt():
            conn = servers.mysql_connect(self.database)
            try:
                with conn.cursor() as cur:
                    cur.execute(f"INSERT INTO {TABLE} (id, version, pad) VALUES (%s, 1, 'b')",
                                (key,))
            except pymysql.err.IntegrityError:
                pass        # an earlier attempt committed, its answer was lost
            finally:
                conn.close()
            return True
        wait_for(attempt, RECONNECT_TIMEOUT, "a bystander row", interval=0.05)

    def run(self) -> None:
        conn = None
        key = 0
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            try:
                if conn is None:
                    conn = servers.mysql_connect(self.database)
                key -= 1
                with conn.cursor() as cur:
                    cur.execute(f"INSERT INTO {TABLE} (id, version, pad) VALUES (%s, 1, 'b')",
                                (key,))
                    if key % 3 == 0:
                        cur.execute(f"UPDATE {TABLE} SET version = version + 1 WHERE id = %s",
                                    (key + 1,))
                self.writes += 1
            except pymysql.err.MySQLError:
                self.errors += 1
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                conn = None
                hold(0.2, self.stop_event.is_set)     # the server is restarting: retry pace
            next_at = max(next_at + 1.0 / self.rate, time.monotonic() - 1.0)
            hold(next_at - time.monotonic(), self.stop_event.is_set)   # the load's pace
        if conn is not None:
            conn.close()


# -- schema ---------------------------------------------------------------------------------------

ROWS_DDL = f"CREATE TABLE {TABLE} (id INT PRIMARY KEY, version INT NOT NULL, pad TEXT)"
FENCE_DDL = f"CREATE TABLE {FENCE_TABLE} (id INT PRIMARY KEY)"


def create_pg_database(name: str) -> None:
    admin = servers.pg_connect()
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
    finally:
        admin.close()
    conn = servers.pg_connect(name)
    try:
        with conn.cursor() as cur:
            cur.execute(ROWS_DDL)
            # deletes carry the whole old row, version included
            cur.execute(f"ALTER TABLE {TABLE} REPLICA IDENTITY FULL")
            cur.execute(FENCE_DDL)
    finally:
        conn.close()


def drop_pg_database(name: str, slot: str) -> None:
    admin = servers.pg_connect()
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                        (slot,))
            row = cur.fetchone()
            if row is not None:
                if row[0]:
                    cur.execute("SELECT pg_terminate_backend(%s)", (row[0],))

                def idle():
                    cur.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                                (slot,))
                    found = cur.fetchone()
                    return found is None or not found[0]
                wait_for(idle, 20, f"slot {slot} to be released")
                cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                            "pg_replication_slots WHERE slot_name = %s", (slot,))
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        admin.close()


def create_mysql_database(name: str, fence: bool = True) -> None:
    conn = servers.mysql_connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
            cur.execute(f"USE `{name}`")
            cur.execute(ROWS_DDL)
            if fence:
                cur.execute(FENCE_DDL)
    finally:
        conn.close()


def drop_mysql_database(name: str) -> None:
    conn = servers.mysql_connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


def write_fence(kind: str, database: str, fence_id: int) -> None:
    """A row in the fence table (not in the ledger): once its event is in the stream, every
    change committed before it must be there too (commit order per backend)."""
    def attempt():
        if kind == "postgresql":
            conn = servers.pg_connect(database)
        else:
            conn = servers.mysql_connect(database)
        try:
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO {FENCE_TABLE} (id) VALUES (%s)", (fence_id,))
        except (psycopg2.IntegrityError, pymysql.err.IntegrityError):
            pass        # an earlier attempt committed, its answer was lost
        finally:
            conn.close()
        return True
    wait_for(attempt, RECONNECT_TIMEOUT, f"the fence row {fence_id} in {database}",
             interval=0.2)
