"""Is the binlog that holds Lapidus's position about to expire?

Runs in the mysql worker process, from ``MysqlSource.status()`` (once a minute).  A MySQL or
MariaDB server deletes binlogs older than ``binlog_expire_logs_seconds`` (or
``expire_logs_days``).  If Lapidus is behind and the file with its checkpoint goes, the position
is lost: the restart then fails with a purged-binlog error.  The warning comes earlier: when
the checkpoint's file is the oldest binlog the server still keeps, expiry is on, and there are
changes after the checkpoint (Lapidus is behind, not merely idle).
"""

from __future__ import annotations

from typing import List, Optional


def expire_seconds(cur) -> int:
    """The server's binlog expiry in seconds (0 = never)."""
    cur.execute("SHOW VARIABLES WHERE Variable_name IN "
                "('binlog_expire_logs_seconds', 'expire_logs_days')")
    values = {name: value for name, value in cur.fetchall()}
    seconds = int(float(values.get("binlog_expire_logs_seconds") or 0))
    if seconds:
        return seconds
    return int(float(values.get("expire_logs_days") or 0) * 86400)


def binlog_files(cur) -> List[str]:
    cur.execute("SHOW BINARY LOGS")
    return [row[0] for row in cur.fetchall()]


def server_position(cur, mariadb: bool) -> Optional[str]:
    if mariadb:
        cur.execute("SELECT @@gtid_binlog_pos")
    else:
        cur.execute("SELECT @@gtid_executed")
    row = cur.fetchone()
    return row[0] if row else None


def retention_warning(*, checkpoint_file: Optional[str], checkpoint_gtid: Optional[str],
                      files: List[str], expire: int, server_gtid: Optional[str]) -> Optional[str]:
    """The warning to log, or None.  Pure: the queries are made by the caller."""
    if not checkpoint_file or not files:
        return None
    if checkpoint_file not in files:
        return (f"the binlog {checkpoint_file} that holds Lapidus's position is gone from the "
                f"server (oldest kept: {files[0]}); a restart will fail: see "
                f'docs/operations.md, "Recovering a lost position"')
    behind = checkpoint_gtid is None or checkpoint_gtid != server_gtid
    if expire and checkpoint_file == files[0] and len(files) > 1 and behind:
        return (f"the binlog {checkpoint_file} that holds Lapidus's position is the oldest the "
                f"server keeps, and binlogs expire after {expire} s: if Lapidus stays behind "
                f"that long, its position is lost; check the sinks, or raise "
                f"binlog_expire_logs_seconds")
    return None
