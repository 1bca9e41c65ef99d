"""Lapidus: change-data capture from PostgreSQL, MySQL/MariaDB and MongoDB to NATS, stdout and more.

Public API (see docs/python-api.md):

* :class:`Event` - one change, immutable; :func:`encode` gives its JSON line.
* :func:`load_config` - read and validate a lapidus.toml / lapidus.json.
* :func:`stream` - consume one backend's events in-process, as an iterator.
* :class:`Lapidus` - run the whole supervisor (workers, dispatcher, sinks) from code.
"""

__version__ = "0.2.0"

from .events import Event, encode  # noqa: E402


def __getattr__(name):
    # Heavier parts load on first use, so `import lapidus` stays cheap.
    if name in ("stream", "Lapidus"):
        from . import api
        return getattr(api, name)
    if name in ("load_config", "ConfigError"):
        from . import config
        return getattr(config, name)
    raise AttributeError(name)


__all__ = ["Event", "encode", "load_config", "ConfigError", "stream", "Lapidus", "__version__"]
