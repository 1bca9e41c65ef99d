"""The configuration of the run as a base plus what reloads change, rendered on demand.

Reloads (SIGHUP after rewriting the file) change three things, each one flip at a time:

* the **extra backend** (a third one, MariaDB, its own database and table, with its own
  writer): present or absent.  It is present at the start; the harness adds it back before
  the fences, so everything its writer committed must be delivered by the end, removals and
  re-additions notwithstanding (a re-added backend resumes from its checkpoint).
* a **sink option** that keeps subjects the same (the nats plugin's ``ack_timeout``), so the
  stream still captures every event.
* a **backend option** that changes nothing in the events (``batch_size``) of one of the
  backends.

:class:`ConfigPlan` only renders dictionaries; writing the file and signalling Lapidus is
:meth:`bench.chaos.lapidus.LapidusProcess.reload`.
"""

from __future__ import annotations

import copy
from typing import Dict, List, Optional

SINK_OPTION = "ack_timeout"
SINK_OPTION_STEP = 0.5          # added to the base value while flipped
BACKEND_OPTION = "batch_size"
BACKEND_OPTION_FLIPPED = 250    # the base is Lapidus's default (no key in the file)


class ConfigPlan:
    """``base``: the whole configuration without the extra backend; ``extra``: the extra
    backend's entry (None: the run has none)."""

    def __init__(self, base: dict, extra: Optional[dict] = None):
        self.base = base
        self.extra = extra
        self.extra_present = extra is not None
        self.sink_flipped = False
        self.backend_flipped: Dict[str, bool] = {}

    def render(self) -> dict:
        config = copy.deepcopy(self.base)
        if self.extra_present and self.extra is not None:
            config["backends"].append(copy.deepcopy(self.extra))
        if self.sink_flipped:
            nats = config["plugins"]["nats"]
            nats[SINK_OPTION] = nats[SINK_OPTION] + SINK_OPTION_STEP
        for backend in config["backends"]:
            if self.backend_flipped.get(backend["name"]):
                backend[BACKEND_OPTION] = BACKEND_OPTION_FLIPPED
        return config

    def backend_names(self) -> List[str]:
        """The backends the rendered configuration has (enabled, all of them)."""
        return [b["name"] for b in self.render()["backends"]]

    # -- the flips ---------------------------------------------------------------------------

    def flip_extra(self) -> str:
        self.extra_present = not self.extra_present
        return "added" if self.extra_present else "removed"

    def flip_sink_option(self) -> str:
        self.sink_flipped = not self.sink_flipped
        value = self.render()["plugins"]["nats"][SINK_OPTION]
        return f"nats {SINK_OPTION} -> {value:g}"

    def flip_backend_option(self, backend: str) -> str:
        self.backend_flipped[backend] = not self.backend_flipped.get(backend, False)
        value = BACKEND_OPTION_FLIPPED if self.backend_flipped[backend] else "default"
        return f"{backend} {BACKEND_OPTION} -> {value}"
