"""The declaration of one setting (:class:`Setting`), and of a default computed from other
values (:class:`Derived`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Tuple

from .context import Context
from .kinds import Kind
from .names import BACKEND_TYPES


@dataclass(frozen=True)
class Derived:
    """A default computed from other values (``values`` holds the table's checked values,
    including the backend ``name`` once it is assigned)."""

    doc: str
    compute: Callable[[Mapping[str, Any], Context], Any]


#: Marks a setting that has no default: it is left unset (``None``) when absent.
UNSET = None


@dataclass(frozen=True)
class Setting:
    name: str
    kind: Kind
    help: str
    default: Any = UNSET            # a plain value, a Derived, or UNSET
    types: Tuple[str, ...] = BACKEND_TYPES   # backend types it applies to (backend settings only)
    aliases: Tuple[str, ...] = ()
    required: bool = False
    secret: bool = False            # never echoed in errors, masked by Config.redacted()
