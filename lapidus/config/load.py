"""Finding and loading the configuration file (:func:`load_config`), and the control socket
of a possibly broken one (:func:`control_socket_for`, for ``lapidusctl``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional, Tuple, Union

from .errors import ConfigError
from .files import read_file
from .model import Config
from .plugins import PluginValidator
from .validate import parse_config

DEFAULT_FILES: Tuple[str, ...] = ("lapidus.toml", "lapidus.json")


def load_config(path: Union[str, os.PathLike, None] = None, *,
                env: Optional[Mapping[str, str]] = None,
                plugin_validators: Optional[Mapping[str, PluginValidator]] = None,
                secrets_optional: bool = False) -> Config:
    """Read and validate a configuration file.

    ``path`` None means ``./lapidus.toml``, else ``./lapidus.json``.  The format follows the
    suffix (``.toml`` / ``.json``; other names are sniffed: ``{`` first means JSON).  ``env``
    replaces ``os.environ`` for ``${VAR}`` expansion.  ``secrets_optional``: see
    :func:`parse_config` (``lapidus -t`` only; never run such a Config).
    Raises :class:`ConfigError`.
    """
    path = Path(path) if path is not None else default_path()
    source = str(path.absolute())
    data = read_file(path)
    return parse_config(data, source=source, env=env, plugin_validators=plugin_validators,
                        secrets_optional=secrets_optional)


def default_path(or_else: str = "") -> Path:
    """``./lapidus.toml``, else ``./lapidus.json``; a ConfigError saying what to give
    instead (``-c PATH``, and ``or_else``) when neither exists."""
    for name in DEFAULT_FILES:
        if Path(name).is_file():
            return Path(name)
    raise ConfigError([f"no configuration file: neither ./{DEFAULT_FILES[0]} nor "
                       f"./{DEFAULT_FILES[1]} exists (give one with -c PATH{or_else})"])


def control_socket_for(path: Union[str, os.PathLike, None] = None, *,
                       env: Optional[Mapping[str, str]] = None) -> Path:
    """The control socket of the configuration at ``path``, for ``lapidusctl``.

    Judged by ``state_dir`` and ``[control]`` only: an operator must reach a running lapidus
    even after editing a backend into an invalid state (the running one keeps its old
    configuration), and from a shell that lacks the secrets the service's EnvironmentFile
    provides: variables used by backends and plugins are never expanded here.  A variable
    that ``state_dir`` or ``control.socket`` itself uses is needed; the error says so.
    Raises :class:`ConfigError`.
    """
    if path is None:
        path = default_path(" or the control socket with --socket PATH")
    source = str(Path(path).absolute())
    data = read_file(Path(path))
    minimal = {key: data[key] for key in ("state_dir", "control") if key in data}
    minimal["backends"] = [{"type": "postgresql", "database": "placeholder"}]
    try:
        return parse_config(minimal, source=source, env=env).control.socket
    except ConfigError as exc:
        raise ConfigError([f"{p}; it is needed to find the control socket (or give the "
                           f"socket with --socket PATH)" if "environment variable" in p else p
                           for p in exc.problems], source) from None
