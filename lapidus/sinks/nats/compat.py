"""The nats-py internals the nats sink relies on, and the check that the installed nats-py has
them.

Runs in the dispatcher process, at :meth:`lapidus.sinks.nats.NatsSink.start` (imports nothing
at module level, so that ``lapidus -t`` needs no nats-py).

Why internals at all: nats-py's public ``flush()`` writes its PING ahead of what the client
still buffers, so its PONG can confirm messages the server never got (see
:meth:`.wire.Wire.ping`), and nats-py replays its unsent buffer after a reconnect, behind
messages that died with the old socket (see ``Connection._drop_unsent``).  The sink's delivery
guarantee rests on reaching past both.  A nats-py without these attributes would make the sink
either unsafe or silently slower, so the sink refuses to start instead, with the versions it is
tested with.  Keep :data:`SUPPORTED` in step with the pins in pyproject.toml.
"""

from __future__ import annotations

from typing import Any, List

from ..base import SinkError

#: the nats-py releases the test suite ran with (pyproject.toml pins the same)
SUPPORTED = "2.16.x"
PIP_SPEC = "nats-py~=2.16.0"

#: attribute of a fresh ``nats.aio.client.Client`` -> what the sink uses it for
REQUIRED = {
    "_send_command": "hand encoded messages to the client's buffer",
    "_flush_pending": "wake the client's flusher",
    "_flush_queue": "wake the client's flusher",
    "_pending": "write a confirming PING after everything buffered; drop unsent data on a "
                "reconnect",
    "_pending_data_size": "the same",
    "_pongs": "wait for the PONG of that PING",
    "_transport": "write that PING after the buffer",
    "_process_msg": "take acks off the subscription early",
    "_ps": "take acks off the socket reads early",
}
#: attributes of the client's protocol parser (``Client._ps``)
PARSER = ("buf", "state", "parse")


class UnsupportedNatsPy(SinkError):
    """The installed nats-py lacks what the sink needs: retrying cannot help."""


def installed_version() -> str:
    try:
        from importlib.metadata import version
        return version("nats-py")
    except Exception:       # metadata missing (a vendored copy): say so, do not fail here
        return "(unknown version)"


def missing_internals(client: Any) -> List[str]:
    """The names in :data:`REQUIRED` (and ``_ps.<name>`` of :data:`PARSER`) that ``client``
    lacks; empty for a supported nats-py."""
    missing = [name for name in REQUIRED if not hasattr(client, name)]
    parser = getattr(client, "_ps", None)
    if parser is not None:
        missing += [f"_ps.{name}" for name in PARSER if not hasattr(parser, name)]
    return missing


def check_client(client: Any) -> None:
    """Raise :class:`UnsupportedNatsPy` (thing, reason, fix) unless ``client`` has every
    internal the sink relies on."""
    missing = missing_internals(client)
    if not missing:
        return
    uses = "; ".join(f"{name}: {REQUIRED.get(name, 'read acks early')}" for name in missing)
    raise UnsupportedNatsPy(
        f"nats sink cannot start: the installed nats-py {installed_version()} lacks internals "
        f"that Lapidus relies on to confirm a batch only once the server has processed all "
        f"of it ({uses}); Lapidus supports nats-py {SUPPORTED}. Fix: pip install "
        f"'{PIP_SPEC}' into Lapidus's environment (or pip install 'lapidus[nats]')")
