"""Checking the ``plugins`` tables, global and per backend: original Lapidus option names
mapped, the options handed to each plugin's validator.  Part of the validator (see
:mod:`.validate`)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .. import settings as S
from .problems import _BAD, _Problems, _join, _without_bad

#: ``validator(options) -> [(key, message), ...]``; ``key`` is relative to the plugin's table
#: ("" for the table itself).  Sinks provide one as ``Sink.validate``.
PluginValidator = Callable[[Dict[str, Any]], List[Tuple[str, str]]]


class _PluginReader(_Problems):
    """The validator's part that reads plugin tables; with ``plugin_validators`` None, any
    plugin name is accepted and its options are not checked."""

    plugin_validators: Optional[Mapping[str, PluginValidator]]

    def read_plugins(self, raw: Any, path: str) -> Optional[Dict[str, Dict[str, Any]]]:
        """``name -> options`` with plugin aliases mapped; options checked by the validators."""
        if raw is None:
            return None
        plugins: Dict[str, Dict[str, Any]] = {}
        for name, options in raw.items():
            where = _join(path, name)
            if options is _BAD:
                continue
            if not isinstance(options, Mapping):
                header = "backends.plugins" if path.startswith("backends") else "plugins"
                self.problem(where, f"expected a table of options, got {S.describe(options)}; "
                                    f"an empty table enables the plugin with its defaults "
                                    f'({{}} in JSON, a [{_join(header, name)}] header in TOML)')
                continue
            options, spelled = self.plugin_aliases(dict(options), where)
            plugins[name] = options
            if self.plugin_validators is None:
                continue
            validate = self.plugin_validators.get(name)
            if validate is None:
                known = sorted(self.plugin_validators)
                near = S.suggest(name, known) if isinstance(name, str) else None
                hint = f'; did you mean "{near}"?' if near else ""
                self.problem(where, f'unknown plugin "{name}" (known: {", ".join(known)}{hint})')
                continue
            try:
                issues = list(validate(_without_bad(options)))
            except Exception as exc:  # a plugin's bug must not hide the other problems
                self.problem(where, f"the plugin's validator failed: {type(exc).__name__}: {exc}")
                continue
            for key, message in issues:
                key = _as_spelled(str(key), spelled)
                key_path = where if not key else (
                    f"{where}{key}" if key.startswith("[") else f"{where}.{key}")
                origin = self.origin(key_path)
                self.problem(key_path, f"{message} ({origin})" if origin else message)
        return plugins

    def plugin_aliases(self, options: Dict[str, Any],
                       path: str) -> Tuple[Dict[str, Any], Dict[str, str]]:
        """The options under their current names, and ``{current name: the user's spelling}``
        for the original Lapidus names used (problems are reported as the file spells them)."""
        result: Dict[str, Any] = {}
        spelled: Dict[str, str] = {}
        for key, value in options.items():
            name = S.PLUGIN_ALIASES.get(key, key)
            if name != key and name in options:
                self.problem(_join(path, key), f'"{key}" is another name for "{name}", '
                                               f'which is also given; keep only one of them')
                continue
            result[name] = value
            if name != key:
                spelled[name] = key
        return result, spelled


def _as_spelled(key: str, spelled: Mapping[str, str]) -> str:
    """A validator's key (``publish_event_data``, ``subjects[2]``, ``tls.ca``) with its first
    name as the configuration file spells it."""
    cut = min((i for i in (key.find("."), key.find("[")) if i >= 0), default=len(key))
    head = key[:cut]
    return spelled.get(head, head) + key[cut:]
