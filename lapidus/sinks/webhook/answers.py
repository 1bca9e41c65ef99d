"""What a webhook's answer (or its absence) means for the request: the sink's only policy.

Runs in the dispatcher process; pure functions, unit-tested without a server.

* 2xx: every event of the request is confirmed.
* 408, 409, 425, 429 and 5xx, a timeout or a connection error: the server may take it later;
  the same request is sent again after a backoff, or after ``Retry-After`` when the answer has
  one, for ever.  409 is here because the Idempotency-Key draft answers 409 to a retry that
  arrives while the first attempt is still being processed, which our timeout can cause.
* 401 and 403: the server refuses our credentials, not an event; refusing event after event
  would move the whole stream to the dead letters, so the backend waits instead (retrying
  slowly) with one clear error naming the fix.  3xx likewise: the URL is wrong (POSTs are not
  redirected, since a redirect may turn them into GETs).
* Any other 4xx: the server refuses what was sent, for good.  The sink narrows that down to
  one event (see :mod:`lapidus.sinks.webhook`) and raises UndeliverableError for it.
* A server certificate that does not verify (unknown CA, wrong host name): UNTRUSTED, a
  settings problem like 401 (retrying will not cure it), waited on slowly with its fix.
"""

from __future__ import annotations

import email.utils
import time
from typing import NamedTuple, Optional

RETRY_STATUSES = frozenset({408, 409, 425, 429})
CREDENTIAL_STATUSES = frozenset({401, 403})
RETRY_AFTER_MAX = 3600.0      # a server asking for more than an hour is likely wrong

OK, RETRY, SETTINGS, REFUSED, UNTRUSTED = "ok", "retry", "settings", "refused", "untrusted"

CREDENTIALS_FIX = ("check user:password in the url, or the Authorization value in headers, of "
                   "the webhook plugin; the backend waits meanwhile and loses nothing")
REDIRECT_FIX = "set url to the address the server redirects to"
TLS_FIX = ("set tls_ca_file to the CA that signed the server's certificate (and make the url's "
           "host one the certificate names), or use http:// for a server without TLS")
REACH_FIX = ("check that the webhook's receiver runs and that the url's host and port are "
             "right; the backend waits meanwhile and loses nothing")
REFUSED_FIX = ("see why the receiver refuses that event (its answer is quoted above); or set "
               "on_undeliverable = \"dead_letter\" to move it aside and stream on")


class Verdict(NamedTuple):
    kind: str                       # OK | RETRY | SETTINGS | REFUSED | UNTRUSTED
    reason: str                     # for logs and errors, never holding a credential
    fix: str = ""
    retry_after: Optional[float] = None


def retry_after(value: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date); None when
    absent or unreadable.  Capped at :data:`RETRY_AFTER_MAX`."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return min(max(0.0, when - (time.time() if now is None else now)), RETRY_AFTER_MAX)


def judge(status: int, reason: str, text: str = "", retry_after_header: Optional[str] = None,
          location: Optional[str] = None) -> Verdict:
    """The verdict on an HTTP answer (``text``: the start of its body, for the reason)."""
    said = f"HTTP {status} {reason}".strip() + (f": {text}" if text else "")
    if 200 <= status < 300:
        return Verdict(OK, said)
    if status in RETRY_STATUSES or status >= 500:
        return Verdict(RETRY, f"the webhook answered {said}", "",
                       retry_after(retry_after_header))
    if status in CREDENTIAL_STATUSES:
        return Verdict(SETTINGS, f"the webhook refused the credentials ({said})",
                       CREDENTIALS_FIX)
    if 300 <= status < 400:
        where = f" to {location}" if location else ""
        return Verdict(SETTINGS, f"the webhook redirects{where} ({said})", REDIRECT_FIX)
    if 400 <= status < 500:
        return Verdict(REFUSED, f"the webhook refused it ({said})", REFUSED_FIX)
    return Verdict(RETRY, f"the webhook answered {said}")


def transport_failure(error: BaseException, timeout: float) -> Verdict:
    """The verdict on a POST that got no answer."""
    import asyncio
    if isinstance(error, asyncio.TimeoutError):
        return Verdict(RETRY, f"the webhook did not answer within {timeout:g} s (timeout)")
    text = str(error) or type(error).__name__
    lowered = text.lower()
    if "certificate verify failed" in lowered:
        return Verdict(UNTRUSTED, f"the webhook's TLS certificate does not verify: {text}",
                       TLS_FIX)
    cause = getattr(error, "os_error", None) or error      # aiohttp's connector errors
    if isinstance(cause, ConnectionError) or (isinstance(cause, OSError)
                                              and not _is_tls_error(error, cause)):
        # refused, reset, no route: nothing TLS can fix (aiohttp names "ssl:default" in the
        # text of every connection error, plain http:// too)
        fix = REACH_FIX
    else:
        fix = TLS_FIX if _is_tls_error(error, cause) or "certificate" in lowered else ""
    return Verdict(RETRY, f"cannot reach the webhook: {type(error).__name__}: {text}", fix)


def _is_tls_error(error: BaseException, cause: BaseException) -> bool:
    import ssl
    return isinstance(cause, ssl.SSLError) or isinstance(error, ssl.SSLError) \
        or "SSL" in type(error).__name__
