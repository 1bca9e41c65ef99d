"""The environment of the exec sink's command: only what the configuration names.

Runs in the supervisor (:func:`problems`, through ``ExecSink.validate``) and in the dispatcher
(:func:`command_environment`).  Lapidus's own environment can hold secrets (an
``EnvironmentFile`` with database passwords, a NATS token): the command gets none of it unless
the ``pass_env`` option names it.  It always gets what a program needs to run at all and to
read its locale (``PATH``, ``HOME``, ``LANG``, ``LC_*``, when Lapidus has them) and
``LAPIDUS_BACKEND``; the ``env`` table sets values of its own.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Mapping, Tuple

#: passed whenever Lapidus has them (and every LC_* variable)
BASE_NAMES = ("PATH", "HOME", "LANG")
RESERVED = ("LAPIDUS_BACKEND",)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def command_environment(backend: str, pass_env: List[str], env: Mapping[str, str],
                        source: Mapping[str, str] = os.environ) -> Dict[str, str]:
    """The command's environment: the base names and ``pass_env`` taken from ``source``
    (when set there), then ``env``, then ``LAPIDUS_BACKEND``."""
    out = {name: value for name, value in source.items()
           if name in BASE_NAMES or name.startswith("LC_")}
    for name in pass_env:
        if name in source:
            out[name] = source[name]
    out.update((name, value) for name, value in env.items() if value is not None)
    out["LAPIDUS_BACKEND"] = backend
    return out


def problems(options: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """Problems with the ``pass_env`` and ``env`` options as ``(key, message)``; the values of
    ``env`` are never echoed (they may be secrets).  A value of None is no problem: JSON's
    null (the variable is left out), or, for ``lapidus -t``, a secret whose ``${VAR}`` is not
    set in the shell that checks (the configuration check warns about it itself)."""
    out: List[Tuple[str, str]] = []
    pass_env = options.get("pass_env")
    if pass_env is not None:
        if not isinstance(pass_env, list) or not all(isinstance(n, str) for n in pass_env):
            out.append(("pass_env", 'expected a list of variable names (["PGSERVICE", "TZ"])'))
        else:
            for index, name in enumerate(pass_env):
                problem = _name_problem(name)
                if problem:
                    out.append((f"pass_env[{index}]", problem))
    env = options.get("env")
    if env is not None:
        if not isinstance(env, dict):
            out.append(("env", 'expected a table of NAME = "value" '
                               '({ CONSUMER_MODE = "fast" })'))
        else:
            for name, value in env.items():
                problem = _name_problem(name)
                if problem:
                    out.append((f"env.{name}", problem))
                elif value is not None and not isinstance(value, str):
                    out.append((f"env.{name}", "expected a string value (quote numbers)"))
    return out


def _name_problem(name: str) -> str:
    if not _NAME.match(name):
        return "is not a variable name (letters, digits and _, not starting with a digit)"
    if name in RESERVED:
        return f"{name} is set by Lapidus itself"
    return ""
