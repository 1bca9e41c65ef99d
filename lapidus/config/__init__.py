"""Configuration: load, validate and normalise lapidus.toml / lapidus.json.

Runs in the supervisor before fork (and in ``lapidus -t`` and ``lapidusctl``); workers receive
the resulting frozen :class:`BackendConfig` and never read the file themselves.

Contract:

* :func:`load_config` / :func:`parse_config` either return a complete :class:`Config` (every
  default applied, ``${VAR}`` expanded, original Lapidus aliases mapped to snake_case) or raise
  :class:`ConfigError` listing *every* problem found, each as ``key.path: reason (fix)``.
* Error messages never contain a secret value (passwords, tokens, URI passwords).  A refused
  value that came from ``${VAR}`` names the variable.
* ``secrets_optional=True`` (``lapidus -t`` only) turns an unset variable used only in a
  secret into a line of ``Config.warnings``; such a Config is for display, never for running.
* What each setting means, its type and default live in :mod:`lapidus.settings`; this package
  only walks the file and applies those declarations.

The package only re-exports; each module has one job:

* :mod:`.model`: the frozen result, :class:`Config` and :class:`BackendConfig`.
* :mod:`.errors`: :class:`ConfigError`.
* :mod:`.load`: finding and loading the file; the control socket for ``lapidusctl``.
* :mod:`.files`: TOML / JSON reading and syntax errors.
* :mod:`.validate`: :func:`parse_config` and the validator, made of :mod:`.variables`
  (``${VAR}``), :mod:`.tables`, :mod:`.plugins`, :mod:`.backends` and :mod:`.problems`.
* :mod:`.secrets`: masking and scrubbing secrets.
* :mod:`.preflight`: :func:`check_preflight`, a valid configuration against this machine
  (``state_dir`` writable, ``[http] listen`` free); for ``lapidus -t`` and the supervisor's
  start (:func:`state_dir_problems` alone, e.g. for a reload that adds a backend).
"""

from __future__ import annotations

import os

from .errors import ConfigError
from .files import read_file
from .load import DEFAULT_FILES, control_socket_for, load_config
from .model import BackendConfig, Config, ControlConfig, HttpConfig, LogConfig, SupervisorConfig
from .plugins import PluginValidator
from .preflight import bind_problem, check_preflight, state_dir_problems
from .secrets import mask_secrets, mask_uri
from .validate import parse_config

__all__ = [
    "BackendConfig", "Config", "ConfigError", "ControlConfig", "DEFAULT_FILES", "HttpConfig",
    "LogConfig", "PluginValidator", "SupervisorConfig", "bind_problem", "check_preflight",
    "control_socket_for", "load_config", "mask_secrets", "mask_uri", "parse_config",
    "read_file", "state_dir_problems",
]


def _running_as_root() -> bool:
    # Lives here, not in validate.py, and the validator looks it up here at each use, so that
    # patching lapidus.config._running_as_root takes effect.
    return os.geteuid() == 0
