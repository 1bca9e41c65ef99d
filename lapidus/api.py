"""Using Lapidus from Python code.

* :func:`stream` runs one backend's source in the calling process and yields its events.  A
  position is checkpointed only after the caller asked for the next batch, i.e. after it has
  handled every event of the previous one: at-least-once, like the daemon.
* :class:`Lapidus` runs the full supervisor (worker processes, dispatcher, sinks) in the
  foreground, exactly as the ``lapidus`` command does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Union

from . import logs
from .checkpoint import CheckpointStore
from .config import BackendConfig, Config, ConfigError, load_config, parse_config
from .events import Event
from .workers.base import BackendError


def _backend_from(spec: Union[BackendConfig, Mapping[str, Any]]) -> BackendConfig:
    """The backend ``stream`` was given; a :class:`ConfigError` naming what is wrong with it
    (every problem, as ``lapidus -t`` lists them), never a raw TypeError or ValueError."""
    if isinstance(spec, BackendConfig):
        return spec
    if not isinstance(spec, Mapping):
        shown = repr(spec) if not isinstance(spec, str) else "a string"   # may hold a password
        raise ConfigError([
            f"backend: {shown} ({type(spec).__name__}) is not a backend; give a dict in "
            f'configuration-file form, e.g. {{"type": "postgresql", "host": "127.0.0.1", '
            f'"database": "shop"}}, or a BackendConfig'], "<stream>")
    return parse_config({"backends": [dict(spec)]}, source="<stream>").backends[0]


def _backend_directory(state_dir: Union[str, Path], name: str) -> Path:
    """``<state_dir>/<name>``, created (private) where missing; a ConfigError naming the
    path and the reason where it cannot be."""
    directory = Path(state_dir) / name
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise ConfigError([f"state_dir: cannot use {directory} as the backend's directory "
                           f"({exc.strerror or exc}); give a state_dir that is a directory "
                           f"this user may write"], "<stream>") from None
    return directory


def stream(backend: Union[BackendConfig, Mapping[str, Any]], *, state_dir: Union[str, Path],
           batch_size: int = 1000, idle_timeout: Optional[float] = None) -> Iterator[Event]:
    """Yield the events of one backend, in commit order, resuming from ``state_dir``.

    ``backend`` is a :class:`BackendConfig` or a dict in configuration-file form
    (``{"type": "postgresql", "database": "shop", ...}``).  With ``idle_timeout`` the iterator
    ends after that many seconds without a change; otherwise it runs until closed.  Closing the
    generator (``break`` out of a ``for`` loop) releases connections and child processes.
    """
    from .workers.runner import make_source

    import structlog
    if not structlog.is_configured():
        logs.configure("auto", "info")   # to standard error, never into the caller's stdout
    config = _backend_from(backend)
    directory = _backend_directory(state_dir, config.name)
    store = CheckpointStore(directory)
    source = make_source(config, directory, logs.get_logger(backend=config.name))
    # Opened now, not at the first next(): connection errors surface here, and changes
    # committed after this call returns are part of the stream.
    try:
        source.open(store.load())
    except BackendError as exc:
        source.close()
        raise _one_attempt(exc) from None
    return _events(source, store, batch_size, idle_timeout)


def _one_attempt(exc: BackendError) -> BackendError:
    """The error as a program that tries once tells it: nothing here retries, so without
    the worker's closing "(retrying)"."""
    return BackendError(exc.for_one_attempt(), fatal=exc.fatal)


def _events(source, store: CheckpointStore, batch_size: int,
            idle_timeout: Optional[float]) -> Iterator[Event]:
    pending = None
    idle = 0.0
    try:
        while True:
            if pending is not None:
                store.save(pending)
                source.commit(pending)
                pending = None
            try:
                batch = source.read(batch_size, 0.5)
            except BackendError as exc:
                raise _one_attempt(exc) from None
            if batch.checkpoint is None:
                idle += 0.5
                if idle_timeout is not None and idle >= idle_timeout:
                    return
                continue
            idle = 0.0
            yield from batch.events
            pending = batch.checkpoint
    finally:
        source.close()


class Lapidus:
    """The supervisor, from code: ``Lapidus("lapidus.toml").run()`` blocks until stopped."""

    def __init__(self, config: Union[Config, str, Path, Mapping[str, Any]]):
        if isinstance(config, Config):
            self.config = config
        elif isinstance(config, Mapping):
            self.config = parse_config(dict(config), source="<code>")
        else:
            self.config = load_config(config)

    def run(self) -> int:
        """Run in the foreground until SIGTERM/SIGINT; returns the exit code."""
        from .supervisor.arbiter import Arbiter
        logs.configure(self.config.log.format, self.config.log.level, process="supervisor")
        return Arbiter(self.config).run()
