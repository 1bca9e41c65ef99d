"""Start-up checks of a MySQL/MariaDB server for change data capture.

Runs in the mysql worker process, inside ``MysqlSource.open()``.  Every problem is named with
its fix; all problems found are reported at once in one fatal :class:`BackendError` (retrying
cannot fix a server setting).  :func:`problems` is pure (it judges values already read), so
each rule is unit-tested without a server; :func:`check_server` does the queries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import pymysql

from ..base import BackendError
from .settings import MysqlSettings

VARIABLES = ("log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata",
             "log_bin_compress", "binlog_transaction_compression", "server_id", "gtid_mode",
             "version", "version_comment")


@dataclass
class ServerFacts:
    """What the checks need to know about the server (read by :func:`read_facts`)."""

    variables: Dict[str, str]
    grants: List[str] = field(default_factory=list)
    replicas: List[Tuple[int, str]] = field(default_factory=list)   # (server_id, reported host)
    replicas_visible: bool = True

    @property
    def mariadb(self) -> bool:
        text = (self.variables.get("version", "") + " "
                + self.variables.get("version_comment", "")).lower()
        return "mariadb" in text


def _on(value: Optional[str]) -> bool:
    return (value or "").strip().upper() in ("ON", "1", "TRUE", "YES")


# ---------------------------------------------------------------------------------------
# privileges

_GRANT = re.compile(r"^GRANT\s+(?P<privs>.+?)\s+ON\s+(?:(?:TABLE|FUNCTION|PROCEDURE)\s+)?"
                    r"(?P<target>\S+)\s+TO\s", re.I | re.S)
_ROLE_GRANT = re.compile(r"^GRANT\s+(?P<roles>[^()]+?)\s+TO\s", re.I | re.S)

REPLICATION_SLAVE = {"REPLICATION SLAVE", "REPLICATION REPLICA"}   # MariaDB >= 10.5 synonym
REPLICATION_CLIENT = {"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"}


def _split_privileges(text: str) -> Set[str]:
    out, depth, current = set(), 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.add(re.sub(r"\s*\(.*\)", "", "".join(current)).strip().upper())
            current = []
        else:
            current.append(ch)
    out.add(re.sub(r"\s*\(.*\)", "", "".join(current)).strip().upper())
    return {re.sub(r"\s+", " ", p) for p in out if p}


def _unquote_target(target: str) -> Tuple[str, str]:
    db, _, table = target.partition(".")
    return db.strip("`'\""), table.strip("`'\"")


def parse_grants(lines: Iterable[str]) -> Tuple[Dict[Tuple[str, str], Set[str]], List[str]]:
    """SHOW GRANTS lines -> ({(db, table): privileges}, [role names])."""
    privileges: Dict[Tuple[str, str], Set[str]] = {}
    roles: List[str] = []
    for line in lines:
        match = _GRANT.match(line.strip())
        if match:
            key = _unquote_target(match.group("target"))
            privileges.setdefault(key, set()).update(_split_privileges(match.group("privs")))
            continue
        role = _ROLE_GRANT.match(line.strip())
        if role and " ON " not in line.upper():
            roles += [r.strip().strip("`'\"") for r in role.group("roles").split(",")]
    return privileges, roles


def missing_privileges(grants: Sequence[str], database: Optional[str]) -> List[str]:
    """The privileges CDC needs that ``grants`` (SHOW GRANTS lines) do not give."""
    privileges, _ = parse_grants(grants)
    global_privs = privileges.get(("*", "*"), set())
    if "ALL PRIVILEGES" in global_privs or "ALL" in global_privs:
        return []
    missing = []
    if not global_privs & REPLICATION_SLAVE:
        missing.append("REPLICATION SLAVE")
    if not global_privs & REPLICATION_CLIENT:
        missing.append("REPLICATION CLIENT")
    has_select = "SELECT" in global_privs
    if not has_select and database:
        for (db, _table), privs in privileges.items():
            if db == database and (privs & {"SELECT", "ALL PRIVILEGES", "ALL"}):
                has_select = True
    if not has_select:
        missing.append("SELECT")
    return missing


# ---------------------------------------------------------------------------------------
# the rules


def problems(settings: MysqlSettings, facts: ServerFacts) -> Tuple[List[str], List[str]]:
    """(problems that stop the backend, warnings), each naming the setting and its fix."""
    v = {k.lower(): (val or "") for k, val in facts.variables.items()}
    errors: List[str] = []
    warnings: List[str] = []
    version = "MariaDB >= 10.5, MySQL >= 8.0.1"
    if not _on(v.get("log_bin")):
        errors.append("log_bin is OFF; enable the binary log (log_bin in the server's option "
                      "file, then restart the server)")
    fmt = v.get("binlog_format", "").upper()
    if fmt != "ROW":
        errors.append(f"binlog_format is {fmt or 'unknown'}; set binlog_format=ROW "
                      f"(statement-based events carry no row data)")
    image = v.get("binlog_row_image", "").upper()
    if image and image != "FULL":
        lost = ("update and delete events carry only the key columns in before, and updates "
                "only the changed columns in item; the others are listed in unchanged")
        if settings.allow_partial_row_image:
            warnings.append(f"binlog_row_image is {image} and allow_partial_row_image is set: "
                            f"{lost}")
        else:
            errors.append(f"binlog_row_image is {image}; set binlog_row_image=FULL ({lost}; "
                          f"set allow_partial_row_image=true to accept that)")
    if "binlog_row_metadata" not in v:
        errors.append(f"this server has no binlog_row_metadata setting "
                      f"({v.get('version', '?')}); upgrade to {version}: without it column "
                      f"names are unknown")
    elif v["binlog_row_metadata"].upper() != "FULL":
        errors.append(f"binlog_row_metadata is {v['binlog_row_metadata'].upper()}; set "
                      f"binlog_row_metadata=FULL ({version})")
    if _on(v.get("log_bin_compress")):
        errors.append("log_bin_compress is ON; set log_bin_compress=OFF (rows of compressed "
                      "binlog events are not decoded and would silently vanish)")
    if _on(v.get("binlog_transaction_compression")):
        errors.append("binlog_transaction_compression is ON; set "
                      "binlog_transaction_compression=OFF (rows of compressed transactions are "
                      "not decoded and would silently vanish)")
    missing = missing_privileges(facts.grants, settings.database)
    if missing:
        errors.append(f"user \"{settings.user}\" lacks {', '.join(missing)}; run GRANT "
                      f"{', '.join(missing)} ON *.* TO '{settings.user}'@'<host>'")
    for server_id, host in facts.replicas:
        if server_id == settings.server_id and host != settings.report_host:
            errors.append(f"server_id {settings.server_id} is already used by the replica "
                          f"\"{host}\" (SHOW SLAVE HOSTS); give this backend another server_id "
                          f"(each reader of a server needs its own, or the server disconnects "
                          f"one of them)")
    if not facts.replicas_visible:
        warnings.append("cannot list connected replicas (SHOW SLAVE HOSTS needs REPLICATION "
                        "MASTER ADMIN on MariaDB >= 10.5); server_id clashes go undetected")
    return errors, warnings


def raise_problems(settings: MysqlSettings, errors: List[str]) -> None:
    if not errors:
        return
    who = settings.describe()
    if len(errors) == 1:
        raise BackendError(f"{who}: {errors[0]}", fatal=True)
    listed = "; ".join(f"({i}) {text}" for i, text in enumerate(errors, 1))
    raise BackendError(f"{who}: {len(errors)} problems: {listed}", fatal=True)


# ---------------------------------------------------------------------------------------
# reading the facts


def read_facts(conn) -> ServerFacts:
    """Query what :func:`problems` judges, on an open pymysql connection."""
    cur = conn.cursor()
    try:
        names = ", ".join(f"'{name}'" for name in VARIABLES)
        cur.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")
        variables = {str(row[0]).lower(): str(row[1]) for row in cur.fetchall()}
        cur.execute("SHOW GRANTS")
        grants = [row[0] for row in cur.fetchall()]
        _, roles = parse_grants(grants)
        for role in roles:
            try:
                cur.execute("SHOW GRANTS FOR %s", (role,))
                grants += [row[0] for row in cur.fetchall()]
            except pymysql.err.MySQLError:
                pass       # a role we cannot inspect: judged on what is visible
        replicas, visible = [], False
        # MySQL >= 8.4 knows only the second spelling.
        for statement in ("SHOW SLAVE HOSTS", "SHOW REPLICAS"):
            try:
                cur.execute(statement)
            except pymysql.err.MySQLError:
                continue
            replicas = [(int(row[0]), str(row[1])) for row in cur.fetchall()]
            visible = True
            break
        return ServerFacts(variables, grants, replicas, visible)
    finally:
        cur.close()


def check_server(settings: MysqlSettings, conn, log) -> ServerFacts:
    """Run every check; log warnings; raise one fatal BackendError listing all problems."""
    facts = read_facts(conn)
    errors, warnings = problems(settings, facts)
    for text in warnings:
        log.warning(f"{settings.describe()}: {text}")
    raise_problems(settings, errors)
    return facts
