"""The queue of backfill requests of one backend: files in ``<state_dir>/<backend>/backfills/``.

Written by the supervisor (``lapidusctl backfill``) and by the dispatcher (a websocket
client's ``snapshot=1``), read by the backend's worker; a file
survives restarts of both, so a queued request is never forgotten:

* ``<n>.json`` (n zero-padded): ``{"n", "table", "where", "requested_at"}``, and ``"sink"``
  for a run made for one sink (:mod:`lapidus.sink_runs`), a request that is queued or
  running.  ``n`` numbers the backend's backfills (1, 2, ...; 0 is the initial snapshot) and
  goes into the ids of their ``read`` events.
* ``sequence``: the last ``n`` handed out.
* ``<n>.refused``: ``{"n", "table", "reason"}``, written by the worker instead of running it.

The worker removes ``<n>.json`` once a saved checkpoint says run ``n`` is finished; the
supervisor (or the dispatcher, for a sink's run) removes it to cancel (the worker stops the
run when it sees the file gone).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional

import orjson

from ...checkpoint import fsync_dir, write_durably

DIRECTORY = "backfills"


@dataclass(frozen=True)
class BackfillRequest:
    n: int
    table: str
    where: Optional[str]
    requested_at: str = ""
    sink: Optional[str] = None      # the run is this sink's alone (lapidus.sink_runs)

    def fields(self) -> dict:
        fields = {"n": self.n, "table": self.table, "where": self.where,
                  "requested_at": self.requested_at}
        if self.sink is not None:
            fields["sink"] = self.sink
        return fields


class BackfillQueue:
    """One backend's request files (see the module); safe in both processes."""

    def __init__(self, backend_state_dir: Path):
        self.directory = Path(backend_state_dir) / DIRECTORY

    # -- supervisor -----------------------------------------------------------------------

    def add(self, table: str, where: Optional[str],
            sink: Optional[str] = None) -> BackfillRequest:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        sequence = self.directory / "sequence"
        try:
            last = int(sequence.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            last = 0
        # never below a request still on disk (a sequence file lost with a copied state)
        n = max([last] + [r.n for r in self.pending()] + [r["n"] for r in self.refused()]) + 1
        write_durably(sequence, str(n).encode())
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        request = BackfillRequest(n, table, where, now.replace("+00:00", "Z"), sink)
        write_durably(self._path(n, "json"), orjson.dumps(request.fields()))
        return request

    def cancel(self, table: Optional[str] = None,
               runs: Optional[Iterable[int]] = None) -> List[BackfillRequest]:
        """Remove the requests (of ``table``, as given to :meth:`add`, or those numbered in
        ``runs``, or all); returns them."""
        numbers = None if runs is None else set(runs)
        gone = [r for r in self.pending() if (table is None or r.table == table)
                and (numbers is None or r.n in numbers)]
        for request in gone:
            self._remove(self._path(request.n, "json"))
        return gone

    # -- worker ---------------------------------------------------------------------------

    def pending(self) -> List[BackfillRequest]:
        """The requests on disk, oldest first; an unreadable file is skipped (a torn write
        cannot happen, see write_durably; a hand-made one is left for the operator)."""
        requests = []
        for path in self._files("json"):
            try:
                fields = orjson.loads(path.read_bytes())
                requests.append(BackfillRequest(int(fields["n"]), str(fields["table"]),
                                                fields.get("where"),
                                                fields.get("requested_at", ""),
                                                fields.get("sink")))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(requests, key=lambda r: r.n)

    def finished(self, n: int) -> None:
        """Requests up to ``n`` are done (a saved checkpoint says so): forget them."""
        for request in self.pending():
            if request.n <= n:
                self._remove(self._path(request.n, "json"))

    def refuse(self, request: BackfillRequest, reason: str, keep: int) -> None:
        """Replace the request by its refusal; only the newest ``keep`` refusals stay."""
        write_durably(self._path(request.n, "refused"),
                      orjson.dumps({"n": request.n, "table": request.table, "reason": reason}))
        self._remove(self._path(request.n, "json"))
        for old in self.refused()[:-keep]:
            self._remove(self._path(old["n"], "refused"))

    def refused(self) -> List[dict]:
        out = []
        for path in self._files("refused"):
            try:
                out.append(orjson.loads(path.read_bytes()))
            except (OSError, ValueError):
                continue
        return sorted(out, key=lambda r: r.get("n", 0))

    # -- files ----------------------------------------------------------------------------

    def _path(self, n: int, suffix: str) -> Path:
        return self.directory / f"{n:08d}.{suffix}"

    def _files(self, suffix: str) -> List[Path]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return [self.directory / name for name in names
                if name.endswith("." + suffix) and name[:-len(suffix) - 1].isdigit()]

    def _remove(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.directory)
