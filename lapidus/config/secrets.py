"""Keeping secrets out of sight: masking them for display (``lapidus -t``, reprs) and
scrubbing them out of error messages.  Which keys hold secrets is
:func:`lapidus.settings.is_secret_key`'s call."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Set

from .. import settings as S


_URI_PASSWORD_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:@/]*):(?P<pw>[^\s/]*)@")
# NATS URLs may carry a bare token as user info: nats://s3cr3t@host:4222
_NATS_TOKEN_RE = re.compile(r"(?P<head>\b(?:nats|tls|ws|wss)://)(?P<tok>[^\s:@/]+)@")


def mask_uri(text: str) -> str:
    """``scheme://user:pw@host`` -> ``scheme://user:***@host``; NATS token URLs -> ``***@``."""
    text = _URI_PASSWORD_RE.sub(r"\g<head>:***@", text)
    return _NATS_TOKEN_RE.sub(r"\g<head>***@", text)


def mask_secrets(value: Any, key: Any = None) -> Any:
    """A JSON-able copy of ``value`` with secrets masked: values under secret-looking keys
    (see :func:`lapidus.settings.is_secret_key`) and passwords inside URIs."""
    if isinstance(value, Mapping):
        return {str(k): mask_secrets(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_secrets(v, key) for v in value]
    if value is None:
        return None
    if S.is_secret_key(key):
        return "***"
    if isinstance(value, str):
        return mask_uri(value)
    if isinstance(value, Path):
        return str(value)
    return value


def _collect_secrets(value: Any, key: Any = None) -> Set[str]:
    """Every secret string in the raw data, so error messages can be scrubbed of them."""
    found: Set[str] = set()
    if isinstance(value, Mapping):
        for k, v in value.items():
            found |= _collect_secrets(v, k)
    elif isinstance(value, list):
        for v in value:
            found |= _collect_secrets(v, key)
    elif isinstance(value, str):
        if S.is_secret_key(key) and value:
            found.add(value)
        for match in _URI_PASSWORD_RE.finditer(value):
            found.add(match.group("pw"))
        for match in _NATS_TOKEN_RE.finditer(value):
            found.add(match.group("tok"))
    return found


def _scrub(message: str, secrets: Set[str]) -> str:
    """Belt and braces: messages are written never to echo secrets, but a password typed
    into the wrong key would be echoed as that key's bad value.  Very short secrets are
    skipped, they would garble the message without protecting anything."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4 and secret in message:
            message = message.replace(secret, "***")
    return message
