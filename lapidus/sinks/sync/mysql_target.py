"""A MySQL/MariaDB target of the sync sink: connection, session, lock, state tables, errors.

Runs in the dispatcher process, in the sync sink's worker thread (pymysql, blocking: the client
the MySQL worker uses too).  The same exactly-once record as in a PostgreSQL target
(:mod:`.state`): ``lapidus_sync_state`` and ``lapidus_sync_pending`` in the target, written in
the InnoDB transaction that applies the rows they describe.  Differences that matter:

* the session runs with ``time_zone = '+00:00'`` and a strict ``sql_mode``, so a value the
  column cannot hold is an error (refused, named) and never a silent truncation;
* the connection counts *found* rows (``CLIENT.FOUND_ROWS``): an update under a changed key
  that finds its row with the same values must not be taken for a missing row;
* DDL commits implicitly in MySQL, so it never runs in the applying transaction: the state
  tables are created at connection, a missing target table on a connection of its own
  (:mod:`.mysql_apply`).
"""

from __future__ import annotations

from typing import Optional
from urllib.parse import unquote, urlsplit

import orjson
import pymysql
from pymysql.constants import CLIENT

from ..base import SinkError
from .mysql_apply import MysqlApplier
from .state import PENDING, STATE, Cursor, pending_from_rows, pending_rows
from .order import order_of

# errors that mean "this row, for good": duplicate or missing key of a constraint, NULL into
# NOT NULL, out of range, too long, incorrect value, unknown column or table, a trigger's
# SIGNAL, a CHECK constraint, invalid JSON
_REFUSING = {1048, 1062, 1136, 1146, 1054, 1216, 1217, 1263, 1264, 1265, 1292, 1301, 1364,
             1366, 1367, 1406, 1411, 1451, 1452, 1644, 1690, 3140, 3819, 4025, 4038, 4078}
_STRICT = "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,ERROR_FOR_DIVISION_BY_ZERO"


def connect_args(dsn: str, timeout: float) -> dict:
    """pymysql's arguments for ``mysql://user:password@host:port/database``."""
    url = urlsplit(dsn)
    return {"host": url.hostname or "127.0.0.1", "port": url.port or 3306,
            "user": unquote(url.username or ""), "password": unquote(url.password or ""),
            "database": unquote(url.path.lstrip("/")) or None, "charset": "utf8mb4",
            "connect_timeout": max(1, int(timeout)), "autocommit": False,
            "client_flag": CLIENT.FOUND_ROWS, "init_command":
                f"SET time_zone = '+00:00', sql_mode = '{_STRICT}'"}


def state_database(config) -> str:
    """Where the state tables go: ``state_schema`` when set, else the DSN's database."""
    if config.state_schema and config.state_schema != "public":
        return config.state_schema
    database = connect_args(config.dsn, 1)["database"]
    return database or "lapidus"


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class MysqlTarget:
    name = "MySQL/MariaDB"
    Error = pymysql.err.MySQLError
    Lost = (pymysql.err.OperationalError, pymysql.err.InterfaceError)
    Applier = MysqlApplier

    def connect(self, config, backend: str):
        return pymysql.connect(**connect_args(config.dsn, config.connect_timeout))

    def prepare(self, conn, config, backend: str) -> Cursor:
        database = _ident(state_database(config))
        with conn.cursor() as cur:
            # a MySQL lock is the server's, not a database's: named after the state's too
            cur.execute("SELECT GET_LOCK(%s, 0)",
                        (f"lapidus_sync:{state_database(config)}:{backend}"[:64],))
            if cur.fetchone()[0] != 1:
                raise SinkError(
                    f"sync: another session applies backend {backend!r} into this target "
                    f"(GET_LOCK taken); fix: run one Lapidus per backend and target")
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {database}")
            cur.execute(f"CREATE TABLE IF NOT EXISTS {database}.{STATE} (backend VARCHAR(191) "
                        f"PRIMARY KEY, `cursor` LONGTEXT NOT NULL, `open` LONGTEXT, last_id "
                        f"TEXT, applied_at DATETIME(6) NOT NULL) ENGINE=InnoDB")
            cur.execute(f"CREATE TABLE IF NOT EXISTS {database}.{PENDING} (backend VARCHAR(191) "
                        f"NOT NULL, seq INT NOT NULL, records LONGBLOB NOT NULL, "
                        f"PRIMARY KEY (backend, seq)) ENGINE=InnoDB")
            cur.execute(f"SELECT `cursor`, `open` FROM {database}.{STATE} WHERE backend = %s",
                        (backend,))
            row = cur.fetchone()
            cursor = Cursor()
            if row:
                cursor.keys = {k: int(v) for k, v in orjson.loads(row[0]).items()}
                cursor.load_open(orjson.loads(row[1]) if row[1] else None)
            cur.execute(f"SELECT records FROM {database}.{PENDING} WHERE backend = %s "
                        f"ORDER BY seq", (backend,))
            pending = pending_from_rows(bytes(blob) for (blob,) in cur.fetchall())
            if pending:
                cursor.hold(pending, order_of(pending[0].position, pending[0].type))
        conn.commit()
        return cursor

    @staticmethod
    def save(cur, config, backend: str, cursor: Cursor, last_id: Optional[str], changed: bool,
             keep: int) -> None:
        database = _ident(state_database(config))
        opened = cursor.open_json()
        cur.execute(f"INSERT INTO {database}.{STATE} (backend, `cursor`, `open`, last_id, "
                    f"applied_at) VALUES (%s, %s, %s, %s, NOW(6)) ON DUPLICATE KEY UPDATE "
                    f"`cursor` = VALUES(`cursor`), `open` = VALUES(`open`), "
                    f"last_id = COALESCE(VALUES(last_id), last_id), applied_at = NOW(6)",
                    (backend, orjson.dumps(cursor.keys).decode(), opened, last_id))
        if not changed:
            return
        if not keep:
            cur.execute(f"DELETE FROM {database}.{PENDING} WHERE backend = %s", (backend,))
        blob = pending_rows(cursor.pending[keep:])
        if blob is not None:
            cur.execute(f"SELECT COALESCE(MAX(seq) + 1, 0) FROM {database}.{PENDING} "
                        f"WHERE backend = %s", (backend,))
            cur.execute(f"INSERT INTO {database}.{PENDING} (backend, seq, records) "
                        f"VALUES (%s, %s, %s)", (backend, cur.fetchone()[0], blob))

    @staticmethod
    def refusing(exc: BaseException) -> bool:
        if isinstance(exc, (pymysql.err.IntegrityError, pymysql.err.DataError)):
            return True
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        return code in _REFUSING
