"""The declarations of the top level and of the ``[log]``, ``[control]``, ``[http]`` and
``[supervisor]`` tables, with the defaults derived from the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Tuple

from .context import Context, _home
from .kinds import BackendList, Choice, Int, Listen, PathKind, Plugins, Seconds, Str, Table
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


SECTIONS: Dict[str, Tuple[Setting, ...]] = {
    "": TOP_LEVEL, "log": LOG, "control": CONTROL, "http": HTTP, "supervisor": SUPERVISOR,
}
