"""The MySQL/MariaDB backend (``type = "mysql"``), on python-mysql-replication.

Runs in the mysql worker process, after fork.  :class:`MysqlSource` is the entry point;
the modules each do one job:

``settings``    options and their defaults
``connection``  connect with retry, error messages, the deadline-aware stream connection
``checks``      start-up checks of the server (binlog settings, privileges, server_id)
``reader``      the binlog read loop (no library reconnect, table scope, exact temporals)
``changes``     library events -> Lapidus events, transactions, checkpoints
``values``      column values -> JSON values (``temporal``, ``geometry`` for the hard ones)
``ddl``         classifying statements (DDL, control, account management)
``scope``       database / include / exclude
``position``    GTID state and the checkpoint format
"""

from .source import MysqlSource

__all__ = ["MysqlSource"]
