"""Checks of a valid configuration against this machine, before anything is created: can this
user create and write ``state_dir`` (and each backend's directory in it, the lock file, the
control socket's directory), can ``[http] listen`` be bound, and (``lapidus -t`` only) do the
backends' certificate and key files exist.

Runs in ``lapidus -t`` and in the supervisor at start, before it locks the state directory,
opens the control socket or forks anything, so that a wrong path or a taken port ends in the
same problem lines as any other configuration error (exit 2) instead of a traceback half-way
through start-up (PermissionError, FileExistsError, NotADirectoryError, "Address already in
use" with a stale control socket left behind).

Contract: :func:`check_preflight` raises :class:`ConfigError` listing every problem, each as
``key.path: reason; fix``, and changes nothing on disk (no directory is created, a port is
bound and released at once).  Its answer can be stale by the time the supervisor acts on it
(another program may take the port in between): the supervisor still handles the real bind's
error, and :func:`bind_problem` words it the same way.
"""

from __future__ import annotations

import errno
import os
import pwd
import socket
from pathlib import Path
from typing import List, Optional

from .errors import ConfigError
from .model import Config

LOCK_FILE = "lapidus.lock"      # the supervisor's lock, inside state_dir (see the arbiter)


def check_preflight(config: Config, *, try_bind: bool = True, files: bool = False) -> None:
    """Raise :class:`ConfigError` (``source`` = the file) when this user cannot run
    ``config`` here: :func:`state_dir_problems` and :func:`listen_problems` together, and
    with ``files`` (``lapidus -t``) :func:`file_problems`.  ``try_bind`` False skips binding
    the listen address (its syntax was checked on load)."""
    problems = state_dir_problems(config) + listen_problems(config, try_bind=try_bind)
    if files:
        problems += file_problems(config) + program_problems(config)
    if problems:
        raise ConfigError(problems, config.source)


# -- files a backend's connection reads (lapidus -t) ------------------------------------------

#: the settings that name a file a backend's connection reads (libpq, pymysql, pymongo)
BACKEND_FILES = ("passfile", "sslrootcert", "sslcert", "sslkey", "ssl_ca", "ssl_cert",
                 "ssl_key", "tls_ca_file", "tls_certificate_key_file")


def file_problems(config: Config) -> List[str]:
    """Certificate, key and password files of the backends that do not exist or are not
    files.  (The sinks' and ``[cluster]``'s files are checked with their options, on load.)

    For ``lapidus -t`` only: at start, a backend whose file is missing goes FATAL by itself
    with the same reason while the others run (:mod:`lapidus.workers.tls_files`; libpq skips
    a missing ``passfile`` and the server then refuses the password); ``-t`` says it before
    anything runs.
    Readability is not judged: ``-t`` may run as another user than the service (root, an
    operator), and the connection's own error names a file it may not read."""
    problems: List[str] = []
    for index, backend in enumerate(config.backends):
        for key in BACKEND_FILES:
            path = backend.options.get(key)
            if not path:
                continue
            if not os.path.lexists(path):
                what = "does not exist"
            elif not os.path.isfile(path):
                what = f"is {_what(Path(path))}, not a file"
            else:
                continue
            problems.append(f"backends[{index}].{key}: {path} {what}; give the path of an "
                            f'existing file (backend "{backend.name}" cannot connect as '
                            f"configured without it)")
    return problems


def program_problems(config: Config) -> List[str]:
    """The programs a backend runs that cannot be found: ``pg_recvlogical`` for a PostgreSQL
    backend outside cluster mode (where Lapidus streams the slot itself), named with the
    package that provides it.  For ``lapidus -t``; at start such a backend goes FATAL with
    the same reason."""
    if config.cluster is not None:
        return []
    from ..workers.postgresql.recvlogical import find_pg_recvlogical
    problems: List[str] = []
    for index, backend in enumerate(config.backends):
        if backend.type != "postgresql" or not backend.options.get("enabled", True):
            continue
        configured = backend.options.get("pg_recvlogical")
        if configured:
            if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
                problems.append(
                    f"backends[{index}].pg_recvlogical: {configured} is not an executable "
                    f"file; give the path of pg_recvlogical (Debian/Ubuntu: apt-get install "
                    f"postgresql-client) or leave the setting out to find it on PATH")
            continue
        try:
            find_pg_recvlogical(None)
        except FileNotFoundError:
            problems.append(
                f'backends[{index}]: backend "{backend.name}" runs pg_recvlogical, which is '
                f"not on PATH nor in /usr/lib/postgresql/*/bin; install the PostgreSQL client "
                f"programs (Debian/Ubuntu: apt-get install postgresql-client; RHEL: dnf "
                f"install postgresql) or set pg_recvlogical to its path")
    return problems


# -- the state directory ---------------------------------------------------------------------


def state_dir_problems(config: Config) -> List[str]:
    """``state_dir`` must be a directory this user may write, or creatable (its nearest
    existing parent a directory this user may write); in it, each backend's directory,
    ``<state_dir>/<name>``, and the lock file must not be something else.  Likewise the
    directory of ``control.socket`` when it lies outside ``state_dir``."""
    # os.path's predicates throughout: they answer False on any OSError, where pathlib's
    # raise PermissionError, the very traceback this module is here to prevent.
    state_dir = Path(config.state_dir)
    problem = _directory_problem(state_dir, "set state_dir to")
    if problem:
        return [f"state_dir: {problem}"]
    problems: List[str] = []
    if os.path.isdir(state_dir):
        for index, backend in enumerate(config.backends):
            path = state_dir / backend.name
            owner = f'backend "{backend.name}" (backends[{index}]) keeps its checkpoint there'
            if os.path.lexists(path) and not os.path.isdir(path):
                problems.append(f"state_dir: {path} is {_what(path)}, but {owner}; move it "
                                f"away or rename the backend")
            elif os.path.isdir(path) and not _may_write(path):
                problems.append(f"state_dir: {path} is not writable by user {_user()}, but "
                                f"{owner}; {_chown_fix(path)}")
        lock = state_dir / LOCK_FILE
        if os.path.lexists(lock) and not os.path.isfile(lock):
            problems.append(f"state_dir: {lock} is {_what(lock)}; lapidus keeps its lock file "
                            f"there, move it away")
        elif os.path.isfile(lock) and not os.access(lock, os.R_OK | os.W_OK):
            problems.append(f"state_dir: {lock} (the lock file) is not writable by user "
                            f"{_user()}; {_chown_fix(lock)}")
    socket_path = Path(config.control.socket)
    if socket_path.parent != state_dir:
        problem = _directory_problem(socket_path.parent, "put control.socket in")
        if problem:
            problems.append(f"control.socket: {problem}")
    if os.path.isdir(socket_path):
        problems.append(f"control.socket: {socket_path} is a directory; set control.socket to "
                        f"a path for the socket")
    return problems


def _directory_problem(path: Path, move: str) -> Optional[str]:
    """Why this user cannot use ``path`` as a directory it writes (creating it if need be),
    or None.  ``move`` starts the other fix: "set state_dir to" (a directory ...)."""
    found = _lookup(path)
    if found == "exists":
        if not os.path.isdir(path):
            return f"{path} is {_what(path)}, not a directory; remove it or {move} a directory"
        pseudo = _pseudo_filesystem(path)
        if pseudo:
            return (f"{path} is on the kernel's {pseudo} pseudo-filesystem, where no file can "
                    f"be created; {move} a directory on a disk")
        if not _may_write(path):
            return (f"{path} is not writable by user {_user()}; {_chown_fix(path)}, or {move} "
                    f"a directory this user may write")
        return None
    parent = path
    while found == "missing" and parent != parent.parent:
        parent = parent.parent
        found = _lookup(parent)
    if found == "denied":
        return (f"{path} cannot be reached by user {_user()}: a directory on the way to it is "
                f"not searchable (permission denied); give that user access, or {move} a "
                f"directory this user may write")
    if not os.path.isdir(parent):
        return (f"{path} cannot be created: {parent} is {_what(parent)}, not a directory; "
                f"{move} a directory that does not lie under a file")
    pseudo = _pseudo_filesystem(parent)
    if pseudo:
        return (f"{path} cannot be created: {parent} is on the kernel's {pseudo} "
                f"pseudo-filesystem, where no directory can be made; {move} a directory on a "
                f"disk")
    if not _may_write(parent):
        return (f"{path} does not exist and user {_user()} cannot create it ({parent} is not "
                f"writable); create it as root (install -d -o {_user()} -m 0700 {path}) or "
                f"{move} a directory this user may write")
    return None


#: file systems of the kernel's own objects (/proc, /sys, ...): root "may write" there by
#: access(2), yet mkdir and open(O_CREAT) fail
PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs", "debugfs", "tracefs",
    "pstore", "bpf", "configfs", "fusectl", "efivarfs", "binfmt_misc", "autofs"})


def _pseudo_filesystem(path: Path) -> Optional[str]:
    """The type of the pseudo-filesystem ``path`` (an existing directory) lies on, or None
    (from /proc/self/mounts: the mount point that is its longest prefix)."""
    try:
        real = os.path.realpath(path)
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
            entries = [line.split()[1:3] for line in mounts if len(line.split()) >= 3]
    except OSError:
        return None
    best, kind = "", None
    for point, fstype in entries:
        point = point.replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind if kind in PSEUDO_FILESYSTEMS else None


def _lookup(path: Path) -> str:
    """``exists`` (even a dangling symbolic link), ``missing`` (nothing there, or a file
    on the way: ENOTDIR), or ``denied`` (a directory on the way is not searchable)."""
    try:
        os.lstat(path)
    except PermissionError:
        return "denied"
    except OSError:
        return "missing"
    return "exists"


def _may_write(path: Path) -> bool:
    # Read (list spool segments), write (create files) and search (open them).  os.access
    # answers for the real uid, which is the one lapidus runs as (it is not set-uid), and
    # says no on a read-only mount even for root.
    return os.access(path, os.R_OK | os.W_OK | os.X_OK)


def _what(path: Path) -> str:
    if os.path.islink(path) and not os.path.exists(path):
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    if os.path.isdir(path):
        return "a directory"
    return "a file"


def _chown_fix(path: Path) -> str:
    return f"give it to that user (chown {_user()} {path})"


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:        # a uid without a passwd entry (containers)
        return str(os.getuid())


# -- the HTTP listen address ---------------------------------------------------------------


def listen_problems(config: Config, *, try_bind: bool = True) -> List[str]:
    """With ``try_bind``, bind ``[http] listen`` the way the supervisor will (same family,
    SO_REUSEADDR) and release it at once.  A port held by the running lapidus of this same
    configuration is not a problem: ``lapidus -t`` is run next to it before a reload."""
    if config.http is None or not try_bind:
        return []
    host, port = config.http.host, config.http.port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        return [bind_problem(config.http.listen, exc)]
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE and _held_by_this_lapidus(config, port):
            return []
        return [bind_problem(config.http.listen, exc)]
    finally:
        sock.close()
    return []


def bind_problem(listen: str, exc: OSError) -> str:
    """The problem line for binding ``listen`` (as written in ``[http] listen``) failing
    with ``exc``: for :func:`listen_problems`, and for the supervisor's own bind."""
    host = listen.rsplit(":", 1)[0]
    if isinstance(exc, socket.gaierror):
        return (f"http.listen: cannot resolve the host {host} of {listen}: "
                f"{exc.strerror or exc}; give an IP address (127.0.0.1, [::1]) or a name that "
                f"resolves")
    if exc.errno == errno.EADDRINUSE:
        port = listen.rsplit(":", 1)[-1]
        return (f"http.listen: address in use: another program already listens on {listen}; "
                f"stop it (ss -ltnp 'sport = :{port}' shows which), or choose another port "
                f"in [http] listen")
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"http.listen: {host} is not an address of this machine; use one of its "
                f"addresses, 127.0.0.1 for this machine only or 0.0.0.0 for every interface")
    if exc.errno == errno.EACCES:
        return (f"http.listen: permission denied binding {listen} (ports below 1024 need "
                f"root or CAP_NET_BIND_SERVICE); choose a port from 1024 up")
    if exc.errno == errno.EAFNOSUPPORT:
        return (f"http.listen: this machine has no IPv6 for {listen}; use an IPv4 address")
    return f"http.listen: cannot listen on {listen}: {exc.strerror or exc}"


def _held_by_this_lapidus(config: Config, port: int) -> bool:
    """Whether the supervisor whose pid is in this state_dir's lock file listens on
    ``port``: then the port is taken by this configuration's own running lapidus."""
    try:
        pid = int((Path(config.state_dir) / LOCK_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    import psutil

    try:
        process = psutil.Process(pid)
        # net_connections since psutil 6, connections before (pyproject allows 5.9).
        listing = getattr(process, "net_connections", None) or process.connections
        connections = listing(kind="inet")
    except psutil.AccessDenied:
        # Another user's process (lapidus -t run by an operator, the service as "lapidus"):
        # its sockets cannot be listed, but its command line can; a live lapidus holding
        # this state_dir's lock is taken to be the one on the port.
        try:
            return any("lapidus" in part for part in process.cmdline())
        except psutil.Error:
            return False
    except psutil.Error:                        # gone (a stale lock file)
        return False
    return any(c.status == "LISTEN" and c.laddr and c.laddr.port == port for c in connections)
