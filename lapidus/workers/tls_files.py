"""The certificate and key files a backend's TLS settings name: there and readable, or a
fatal error that says which setting, which file, why, and the fix.

Runs in the worker process (PostgreSQL and MySQL), before each connection attempt.  Needed
because the drivers are vague or silent about these files: libpq skips a client certificate
file that does not exist and connects without it (the server then refuses with an
authentication error that does not mention the file), and Python's ``ssl`` says only
"[Errno 2] No such file or directory" without the path's setting.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .base import BackendError


def check_files(backend: str, options: Mapping[str, object], keys: Iterable[str]) -> None:
    """Raise a fatal :class:`BackendError` for the first of ``keys`` whose file cannot be
    read.  Paths arrive absolute (relative ones were resolved against the configuration
    file's directory by the loader)."""
    for key in keys:
        path = options.get(key)
        if not path:
            continue
        try:
            with open(str(path), "rb") as f:
                f.read(1)
        except FileNotFoundError:
            reason = "does not exist"
        except IsADirectoryError:
            reason = "is a directory, not a PEM file"
        except PermissionError:
            reason = "cannot be read by this process (permission denied)"
        except OSError as exc:
            reason = f"cannot be read ({exc.strerror or exc})"
        else:
            continue
        raise BackendError(
            f'backend "{backend}": {key} file {path} {reason}; fix the path (a relative path '
            f"is relative to the configuration file) or the file's owner and mode",
            fatal=True)
