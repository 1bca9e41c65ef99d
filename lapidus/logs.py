"""Logging set-up: structlog to standard error, JSON lines or console rendering.

Called once in every process (the supervisor before fork, then again in each child after fork,
so no child inherits a half-configured logger).  Standard output stays reserved for events.
Secrets are never passed to a logger; as a second line of defence, values under keys that name
secrets are masked.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional

from . import deferred

deferred.defer("asyncio")     # structlog imports it at its top; only the dispatcher needs it
import structlog  # noqa: E402

SECRET_KEYS = frozenset({"password", "passwd", "token", "secret", "nkey", "creds", "uri"})
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


def _mask_secrets(_logger, _name, event_dict):
    for key in list(event_dict):
        if key in SECRET_KEYS and event_dict[key]:
            event_dict[key] = "***"
    return event_dict


def configure(fmt: str = "auto", level: str = "info", process: Optional[str] = None) -> None:
    """``fmt``: "json", "console" or "auto" (console when standard error is a terminal)."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _mask_secrets,
    ]
    if fmt == "json":
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS.get(level, logging.INFO)),
        # one write per record, newline included: the supervisor and its children share
        # standard error, and print() writes the newline separately when it is unbuffered
        # (PYTHONUNBUFFERED=1), so another process's record could land inside a line
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    if process:
        structlog.contextvars.bind_contextvars(process=process)


def get_logger(**bound):
    return structlog.get_logger().bind(**bound)
