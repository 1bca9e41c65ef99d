"""Which keys name secrets (:func:`is_secret_key`): their values are never echoed in errors
and are masked by ``lapidus -t`` and in reprs (see :mod:`lapidus.config.secrets`)."""

from __future__ import annotations

import re
from typing import Any

_SECRET_WORDS = ("password", "passwd", "secret", "token", "seed", "nkey", "creds",
                 "credential", "apikey", "api_key", "private_key", "access_key",
                 "authorization", "cookie",     # HTTP headers that carry credentials
                 "dsn")                         # a connection string with its password
_SECRET_TOKENS = {"pass", "pwd", "key"}


def is_secret_key(key: Any) -> bool:
    """Whether a key (ours or a plugin's) names a secret: password, token, NATS nkey seeds and
    credentials, API keys.  Deliberately broad: masking a harmless value costs nothing."""
    if not isinstance(key, str):
        return False
    low = key.lower()
    if any(word in low for word in _SECRET_WORDS):
        return True
    tokens = re.split(r"[_\-.]|(?<=[a-z])(?=[A-Z])", key)
    return any(t.lower() in _SECRET_TOKENS for t in tokens) and not low.endswith("_file")
