"""The declarations of the top level and of the ``[log]``, ``[control]``, ``[http]``,
``[supervisor]`` and ``[cluster]`` tables, with the defaults derived from the environment."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any, Dict, Mapping, Tuple

from .context import Context, _home
from .kinds import (BackendList, Choice, Int, Invalid, Kind, Listen, PathKind, Pattern, Plugins,
                    Seconds, Str, Table)
from .setting import UNSET, Derived, Setting


def _state_dir_default(values: Mapping[str, Any], ctx: Context) -> str:
    if ctx.is_root:
        return "/var/lib/lapidus"
    state_home = ctx.env.get("XDG_STATE_HOME", "")
    if state_home.startswith("/"):
        return str(Path(state_home) / "lapidus")
    return str(_home(ctx) / ".local" / "state" / "lapidus")


def _socket_default(values: Mapping[str, Any], ctx: Context) -> str:
    assert ctx.state_dir is not None
    return str(ctx.state_dir / "lapidus.sock")


TOP_LEVEL: Tuple[Setting, ...] = (
    Setting("state_dir", PathKind(), "Checkpoints, spool files and the control socket.",
            Derived("`/var/lib/lapidus` as root, else `$XDG_STATE_HOME/lapidus` "
                    "(`~/.local/state/lapidus`)", _state_dir_default)),
    Setting("log", Table(), "Logging, see `[log]`.", {}),
    Setting("control", Table(), "The control socket used by `lapidusctl`, see `[control]`.", {}),
    Setting("http", Table(), "Status page, metrics and health endpoint, see `[http]`; off when "
            "absent.", UNSET),
    Setting("supervisor", Table(), "Restart policy, see `[supervisor]`.", {}),
    Setting("cluster", Table(), "Share the backends with other Lapidus nodes through a NATS "
            "JetStream key-value bucket, see `[cluster]` and docs/cluster.md; off when absent.",
            UNSET),
    Setting("backends", BackendList(), "The databases to stream, see `[[backends]]`.",
            required=True),
    Setting("plugins", Plugins(), "Global plugins (sinks), name -> options; used by every "
            "backend that has no `plugins` of its own.", {}),
)

LOG: Tuple[Setting, ...] = (
    Setting("format", Choice("auto", "json", "console"),
            "`auto`: console when standard error is a terminal, else JSON lines.", "auto"),
    Setting("level", Choice("debug", "info", "warning", "error"), "Lowest level logged.",
            "info"),
)

CONTROL: Tuple[Setting, ...] = (
    Setting("socket", PathKind(), "Unix socket `lapidusctl` talks to (mode 0600).",
            Derived("`<state_dir>/lapidus.sock`", _socket_default)),
)

HTTP: Tuple[Setting, ...] = (
    Setting("listen", Listen(), "Address of the status page (`/`), `/metrics` (Prometheus) "
            "and `/healthz`.", required=True),
    Setting("token", Str(), "Required by the status page and its JSON (`Authorization: Bearer`, "
            "or entered on the page); open to all who reach `listen` when unset. `/metrics` and "
            "`/healthz` stay open.", secret=True),
)

SUPERVISOR: Tuple[Setting, ...] = (
    Setting("max_restarts", Int(0), "Crashes allowed inside `restart_window` before the "
            "backend is marked FATAL.", 5),
    Setting("restart_window", Seconds(), "Window for counting crashes.", 60.0),
    Setting("backoff_initial", Seconds(), "First restart delay; doubles per crash, with jitter.",
            1.0),
    Setting("backoff_max", Seconds(), "Longest restart delay.", 30.0),
    Setting("stop_timeout", Seconds(), "Grace period between the stop signal and SIGKILL.",
            10.0),
    Setting("heartbeat_timeout", Seconds(), "A running worker silent for this long is "
            "considered wedged, killed and restarted (a worker reports every second while its "
            "figures change, and at least four times per timeout when idle).", 60.0),
)



class ServerUrls(Kind):
    """One URL or a non-empty list of them.  Each URL's form is checked by the nats plugin's
    validator (lapidus.config), which knows the schemes and never echoes a password."""

    doc = "list of URLs"

    def check(self, value: Any, ctx: Context) -> Tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or \
                not all(isinstance(v, str) for v in value):
            raise Invalid('a list of NATS server URLs such as ["nats://10.0.0.1:4222"]')
        return tuple(value)


def _node_default(values: Mapping[str, Any], ctx: Context) -> str:
    """The short host name, with any character a node name cannot hold as ``_``."""
    short = socket.gethostname().split(".")[0] or "node"
    return re.sub(r"[^A-Za-z0-9_-]", "_", short)[:64]


#: A KV key holds the node name (``node.<name>``): the characters NATS allows in a token.
NODE_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
BUCKET_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

CLUSTER: Tuple[Setting, ...] = (
    Setting("servers", ServerUrls(), "NATS servers of the cluster that holds the bucket.",
            required=True),
    Setting("node", Pattern(NODE_RE, "a node name of letters, digits, _ and -",
                            "name"), "This node's name; unique among the nodes.",
            Derived("the host name", _node_default)),
    Setting("bucket", Pattern(BUCKET_RE, "a bucket name of letters, digits, _ and -", "name"),
            "JetStream key-value bucket of the leases and checkpoints (created when missing).",
            "lapidus"),
    Setting("replicas", Int(1, 5), "Replicas of a created bucket: 3 on a three-server NATS "
            "cluster, so losing one server loses nothing.", 1),
    Setting("lease_ttl", Seconds(), "A lease not renewed for this long is taken over by another "
            "node; renewed every fifth of it.", 15.0),
    Setting("max_backends", Int(1), "The most backends this node streams at once; unset: as "
            "many as its fair share needs."),
    Setting("user", Str(), "NATS user name (with password)."),
    Setting("password", Str(), "NATS password (with user).", secret=True),
    Setting("token", Str(), "NATS authentication token.", secret=True),
    Setting("nkeys_seed", PathKind(), "File holding an NKey seed (needs the nkeys package)."),
    Setting("credentials", PathKind(), "A .creds file: JWT plus NKey seed (needs nkeys)."),
    Setting("tls_ca_file", PathKind(), "CA bundle to verify the servers' certificates."),
    Setting("tls_cert_file", PathKind(), "Client certificate (with tls_key_file)."),
    Setting("tls_key_file", PathKind(), "Client private key (with tls_cert_file)."),
    Setting("tls_hostname", Str(), "Host name expected in the servers' certificates."),
)


SECTIONS: Dict[str, Tuple[Setting, ...]] = {
    "": TOP_LEVEL, "log": LOG, "control": CONTROL, "http": HTTP, "supervisor": SUPERVISOR,
    "cluster": CLUSTER,
}
