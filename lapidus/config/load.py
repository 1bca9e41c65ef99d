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
                plugin_validators: Optional[Mapping[str, PluginValidator]] = None) -> Config:
    """Read and validate a configuration file.

    ``path`` None means ``./lapidus.toml``, else ``./lapidus.json``.  The format follows the
    suffix (``.toml`` / ``.json``; other names are sniffed: ``{`` first means JSON).  ``env``
    replaces ``os.environ`` for ``${VAR}`` expansion.  Raises :class:`ConfigError`.
    """
    if path is None:
        found = [Path(name) for name in DEFAULT_FILES if Path(name).is_file()]
        if not found:
            raise ConfigError([f"no configuration file: neither ./{DEFAULT_FILES[0]} nor "
                               f"./{DEFAULT_FILES[1]} exists (give one with -c PATH)"])
        path = found[0]
    path = Path(path)
    source = str(path.absolute())
    data = read_file(path)
    return parse_config(data, source=source, env=env, plugin_validators=plugin_validators)


def control_socket_for(path: Union[str, os.PathLike, None] = None) -> Path:
    """The control socket of the configuration at ``path``, judged by its top-level settings
    only: an operator must reach a running lapidus even after editing a backend into an
    invalid state (the running one keeps its old configuration)."""
    if path is None:
        found = [Path(name) for name in DEFAULT_FILES if Path(name).is_file()]
        path = found[0] if found else Path(DEFAULT_FILES[0])
    data = read_file(Path(path))
    minimal = {key: data[key] for key in ("state_dir", "control") if key in data}
    minimal["backends"] = [{"type": "postgresql", "database": "placeholder"}]
    return parse_config(minimal, source=str(Path(path).absolute())).control.socket
