"""Every exit code of Lapidus's commands and processes, in one place.

Imported by the commands (``lapidus``, ``lapidusctl``), the supervisor and its children; stdlib
only, so any process can import it without pulling in anything else.
"""

# -- the commands (what a user or systemd sees) ---------------------------------------------
OK = 0
RUNTIME = 1             # lapidus: a runtime failure (every backend FATAL, a port in use ...)
USAGE = 2               # invalid configuration or usage; every problem is listed
UNREACHABLE = 3         # lapidusctl: no Lapidus answers on the control socket
REFUSED = 1             # lapidusctl: the supervisor refused the command (unknown backend ...)
INTERRUPTED = 130       # lapidusctl backfill --wait: Ctrl-C stopped following (not the backfill)

# -- children of the supervisor (what the supervisor reads from a worker or the dispatcher) --
CHILD_OK = 0            # stopped as asked
CHILD_ERROR = 1         # crashed: restart with backoff, counted against max_restarts
CHILD_FATAL = 3         # retrying cannot help (configuration, credentials, server settings)
OUTPUT_CLOSED = 4       # dispatcher: a sink's consumer went away for good (stdout | head)
LINK_LOST = 5           # worker: its dispatcher went away; not a crash of the worker
LEASE_LOST = 6          # worker: its lease is lost or ran out (cluster mode); not a crash
FORK_SERVER_LOST = 255  # worker: its parent, the workers' fork server, died (multiprocessing's
                        # report for a child whose server is gone); not a crash of the worker
