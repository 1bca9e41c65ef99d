"""Create the JetStream stream named by the ``stream`` option when it does not exist.

Runs in the dispatcher process, inside its asyncio loop, before the backend's first batch.

``duplicate_window`` (default 120 s, JetStream's own default) is how long the stream remembers
a ``Nats-Msg-Id``.  A replay after a crash resends events the stream may already hold; they
are dropped as duplicates only while they are younger than the window.  So the window must be
longer than the worst time from a publish to its replay: the dispatcher's retry backoff plus a
worker restart plus re-reading the unconfirmed batches.  An existing stream is left as it is;
a window shorter than configured is logged.
"""

from __future__ import annotations

from typing import Any

import nats.js.errors

from ..base import SinkError
from .options import NatsOptions


async def ensure_stream(nc: Any, options: NatsOptions, log: Any) -> None:
    name = options.stream
    if name is None:
        return
    js = nc.jetstream()
    try:
        info = await js.stream_info(name)
    except nats.js.errors.NotFoundError:
        info = None
    except nats.errors.NoRespondersError:
        raise SinkError(f'cannot create JetStream stream "{name}": the server has no '
                        f"JetStream (start nats-server with -js, or set jetstream = false)") \
            from None
    except (nats.errors.TimeoutError, nats.js.errors.APIError) as exc:
        raise SinkError(f'cannot look up JetStream stream "{name}": {exc}') from None
    if info is not None:
        window = info.config.duplicate_window or 0
        if window < options.duplicate_window:
            log.warning("the existing stream remembers message ids for less than "
                        "duplicate_window; replays older than that are stored twice",
                        stream=name, stream_duplicate_window=window,
                        duplicate_window=options.duplicate_window)
        return
    subjects = list(options.stream_subjects)
    try:
        await js.add_stream(name=name, subjects=subjects,
                            duplicate_window=options.duplicate_window)
    except nats.js.errors.BadRequestError as exc:
        raise SinkError(f'cannot create JetStream stream "{name}" for subjects {subjects}: '
                        f"{exc.description} (fix the stream or subjects option, or create the "
                        f"stream yourself)") from None
    except (nats.errors.TimeoutError, nats.js.errors.APIError) as exc:
        raise SinkError(f'cannot create JetStream stream "{name}": {exc}') from None
    log.info("created JetStream stream", stream=name, subjects=subjects,
             duplicate_window=options.duplicate_window)
