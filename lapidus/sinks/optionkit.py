"""Small pieces shared by the option validators of the redis and rabbitmq sinks.

Runs wherever options are validated: the supervisor, ``lapidus -t`` and the dispatcher.  Stdlib
only (no client library), so a configuration can be checked on a host without the sink's extra.

Problems are ``(key, message)`` pairs, as :meth:`lapidus.sinks.base.Sink.validate` returns them;
the configuration check prefixes the key path.  Messages never echo a value that may be secret
(URLs carry ``user:password@``): they name the key and say what is wrong.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from ..settings import suggest

Problems = List[Tuple[str, str]]


@dataclass(frozen=True)
class Option:
    kind: str            # str | bool | number (seconds, > 0) | count (int >= 1) | file
    default: Any
    help: str


def describe(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "a table", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def type_problem(kind: str, value: Any) -> Optional[str]:
    if kind in ("str", "file"):
        return None if isinstance(value, str) else f"expected a string, got {describe(value)}"
    if kind == "bool":
        return None if isinstance(value, bool) else f"expected true or false, got {describe(value)}"
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number of seconds, got {describe(value)}"
        return None if value > 0 else f"must be greater than 0, got {value}"
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected a whole number, got {describe(value)}"
        return None if value >= 1 else f"must be at least 1, got {value}"
    raise AssertionError(kind)


def check_types(plugin: str, declared: Mapping[str, Option], options: Mapping[str, Any],
                problems: Problems) -> Dict[str, Any]:
    """Unknown keys (with a did-you-mean) and wrong types go to ``problems``; returns the
    values that have the right type (``null`` means "the default" and is left out)."""
    values: Dict[str, Any] = {}
    for key, value in options.items():
        if key not in declared:
            near = suggest(key, list(declared)) if isinstance(key, str) else None
            hint = f' (did you mean "{near}"?)' if near else ""
            problems.append((key, f"unknown option for the {plugin} plugin{hint}"))
            continue
        if value is None:
            continue
        problem = type_problem(declared[key].kind, value)
        if problem:
            problems.append((key, problem))
            continue
        values[key] = value
    return values


def url_problem(url: str, schemes: Sequence[str], example: str) -> Optional[str]:
    """What is wrong with a server URL, without echoing it (it may hold a password)."""
    if "://" not in url:
        return (f"is not a URL: expected scheme://host:port, as {example} (is \":\" or \"//\" "
                f"missing after the scheme?)")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return f"is not a valid URL (expected {example}; is the port a number?)"
    if parts.scheme.lower() not in schemes:
        return (f'has the scheme "{parts.scheme}"; expected '
                + " or ".join(f"{s}://" for s in schemes) + f" (as {example})")
    if not parts.hostname:
        return f"has no host (expected {example})"
    return None


def redact_url(url: str) -> str:
    """``scheme://user:pw@host:port/x`` -> ``scheme://host:port``: safe for logs and messages."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable URL>"
    return f"{parts.scheme}://{host}{port}"


def file_problem(path: str) -> Optional[str]:
    if not os.path.isfile(path):
        return "no such file (give the path of an existing file)"
    if not os.access(path, os.R_OK):
        return "the file is not readable by this user"
    return None


def missing_extra(module: str, package: str, extra: str) -> Optional[Tuple[str, str]]:
    """The problem to report when the sink's client library is not installed, else None."""
    if importlib.util.find_spec(module) is not None:
        return None
    return ("", f"needs the {package} package, which is not installed "
                f"(pip install 'lapidus[{extra}]')")
