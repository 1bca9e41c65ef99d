"""Checking one table against its declarations: unknown keys (with did-you-mean), alias
clashes, values, required keys, plain and derived defaults.  Part of the validator (see
:mod:`.validate`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Set, Tuple

from .. import settings as S
from .problems import _BAD, _Problems, _has_bad, _join


@dataclass
class _Table:
    """One checked table: canonical name -> value, plus which keys the user wrote."""

    values: Dict[str, Any]
    written: Dict[str, str]          # canonical name -> key as written (maybe an alias)
    bad: Set[str]                    # canonical names whose value was rejected


class _TableReader(_Problems):
    """The validator's part that checks tables; ``ctx`` is what kinds and derived defaults
    may look at."""

    ctx: S.Context

    def read_table(self, raw: Mapping[str, Any], decls: Sequence[S.Setting], path: str, *,
                   elsewhere: Optional[Mapping[str, Tuple[str, ...]]] = None,
                   kind_label: str = "", tolerate: Sequence[str] = (),
                   suggest_from: Optional[Sequence[str]] = None,
                   ctx: Optional[S.Context] = None) -> _Table:
        """Check ``raw`` against ``decls``: unknown keys, alias clashes, values, required keys.

        ``elsewhere`` maps keys that belong to other backend types to those types (for a
        better message); keys in ``tolerate`` are silently ignored (used when the backend
        type is unknown, so only real misspellings are reported); ``suggest_from`` widens
        the keys a did-you-mean may propose; ``ctx`` replaces ``self.ctx`` for the kinds.
        """
        ctx = ctx or self.ctx
        table = _Table(values={}, written={}, bad=set())
        by_name = {s.name: s for s in decls}
        alias_of = {a: s.name for s in decls for a in s.aliases}
        valid_keys = [*by_name, *alias_of]
        given: Dict[str, Any] = {}
        for key, value in raw.items():
            name = alias_of.get(key, key)
            if name not in by_name:
                if key not in tolerate:
                    self.problem(_join(path, key), self.unknown_key(
                        key, suggest_from or valid_keys, elsewhere, kind_label))
                continue
            if name in table.written:
                first = table.written[name]
                alias = key if key != name else first
                self.problem(_join(path, alias), f'"{alias}" is another name for "{name}", '
                                                 f'which is also given; keep only one of them')
                continue
            table.written[name] = key
            given[name] = value
        for s in decls:
            if s.name in given:
                value = given[s.name]
                # Only leaf values and pattern lists can hold an unset ${VAR}; nested tables
                # (backends, plugins) are walked further down and report their own.
                if value is _BAD or (isinstance(s.kind, S.Globs) and _has_bad(value)):
                    table.values[s.name] = None
                    table.bad.add(s.name)
                    continue
                try:
                    table.values[s.name] = s.kind.check(value, ctx)
                except S.Invalid as exc:
                    self.rejected(_join(path, table.written[s.name]), value, exc, s.secret)
                    table.values[s.name] = None
                    table.bad.add(s.name)
            elif s.required:
                table.values[s.name] = None
                table.bad.add(s.name)
                self.problem(_join(path, s.name), self.missing(s, kind_label))
            else:
                default = s.default
                table.values[s.name] = None if isinstance(default, S.Derived) else default
        return table

    def rejected(self, key_path: str, value: Any, exc: S.Invalid, secret: bool) -> None:
        """Report a value its kind refused: each bad element of a list under its own index."""
        if exc.items:
            for index, item in exc.items:
                where = f"{key_path}[{index}]"
                self.problem(where, item.render(value[index], secret=secret,
                                                origin=self.origin(where)))
        else:
            self.problem(key_path, exc.render(value, secret=secret, origin=self.origin(key_path)))

    @staticmethod
    def missing(setting: S.Setting, kind_label: str) -> str:
        if setting.name == "backends":
            return ("missing: configure at least one backend "
                    '([[backends]] in TOML, "backends": [...] in JSON)')
        if setting.name == "type":
            return f"missing (expected {', '.join(S.BACKEND_TYPES)})"
        where = f" for {kind_label} backends" if kind_label else ""
        return f"missing (required{where}: {setting.help.rstrip('.')})"

    @staticmethod
    def unknown_key(key: str, valid: Sequence[str],
                    elsewhere: Optional[Mapping[str, Tuple[str, ...]]], kind_label: str) -> str:
        if elsewhere and key in elsewhere:
            types = " and ".join(elsewhere[key])
            return f"not a {kind_label} setting ({key} applies to {types} backends)"
        near = S.suggest(key, valid) if isinstance(key, str) else None
        if near:
            return f'unknown key (did you mean "{near}"?)'
        if len(valid) <= 10:
            return f"unknown key (expected one of {', '.join(sorted(valid))})"
        return "unknown key"

    def fill_derived(self, table: _Table, decls: Sequence[S.Setting], ctx: S.Context) -> None:
        """Compute defaults that depend on other values (slot from name ...)."""
        for s in decls:
            if (isinstance(s.default, S.Derived) and table.values.get(s.name) is None
                    and s.name not in table.bad and s.name not in table.written):
                table.values[s.name] = s.default.compute(table.values, ctx)

    def read_section(self, top: _Table, name: str, decls: Sequence[S.Setting],
                     ctx: Optional[S.Context] = None) -> _Table:
        raw = top.values[name]
        table = self.read_table({} if raw is None else raw, decls, name)
        self.fill_derived(table, decls, ctx or self.ctx)
        return table
