"""Whole seconds since the Unix epoch as UTC text, for the commit times every worker emits.

Pure; runs in the worker processes.  Cached, because the changes read together mostly share
their second (single-row transactions many to a second, ``now()`` in a bulk write), and building
the text through ``datetime`` once per transaction was a visible share of a worker's time.
"""

from __future__ import annotations

import functools
import time


@functools.lru_cache(maxsize=1024)
def utc_seconds_text(seconds: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` of ``seconds`` since 1970-01-01 UTC."""
    t = time.gmtime(seconds)
    return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}"
            f"T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}")
