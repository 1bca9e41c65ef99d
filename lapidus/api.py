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
from .config import BackendConfig, Config, load_config, parse_config
from .events import Event


def _backend_from(spec: Union[BackendConfig, Mapping[str, Any]]) -> BackendConfig:
    if isinstance(spec, BackendConfig):
        return spec
    return parse_config({"backends": [dict(spec)]}, source="<stream>").backends[0]


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
    directory = Path(state_dir) / config.name
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = CheckpointStore(directory)
    source = make_source(config, directory, logs.get_logger(backend=config.name))
    # Opened now, not at the first next(): connection errors surface here, and changes
    # committed after this call returns are part of the stream.
    source.open(store.load())
    return _events(source, store, batch_size, idle_timeout)


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
            batch = source.read(batch_size, 0.5)
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
