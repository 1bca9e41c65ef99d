"""Configuration: load, validate and normalise lapidus.toml / lapidus.json.

(Skeleton: the full loader and validator is being written.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class BackendConfig:
    """One configured backend, normalised: snake_case keys, defaults applied, secrets expanded."""

    name: str
    type: str                                   # "postgresql" | "mysql" | "mongo"
    options: Dict[str, Any] = field(default_factory=dict)
    include_tables: Tuple[str, ...] = ()
    exclude_tables: Tuple[str, ...] = ()
    plugins: Optional[Dict[str, Dict[str, Any]]] = None   # per-backend plugins replace global ones
