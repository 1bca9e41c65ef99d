"""The generated part of ``docs/configuration.md``: the settings tables, written from the
declarations so the validator and the documentation cannot drift apart (a unit test compares
the two).  A maintainer's tool: ``python -m lapidus.settings --write docs/configuration.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Sequence

from .backends import BACKEND_COMMON, backend_settings
from .kinds import ByteSize
from .names import BACKEND_TYPES, BUILTIN_PLUGINS, PLUGIN_ALIASES
from .sections import CLUSTER, CONTROL, HTTP, LOG, SUPERVISOR, TOP_LEVEL
from .setting import UNSET, Derived, Setting


DOC_BEGIN = "<!-- BEGIN GENERATED SETTINGS (python -m lapidus.settings --write) -->"
DOC_END = "<!-- END GENERATED SETTINGS -->"


def _default_doc(setting: Setting) -> str:
    if setting.required:
        return "**required**"
    default = setting.default
    if isinstance(default, Derived):
        return default.doc
    if default is UNSET:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, int) and isinstance(setting.kind, ByteSize):
        for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if default % size == 0:
                return f"`{default // size}{unit}`"
    if isinstance(default, (tuple, list)):
        return "`[]`" if not default else f"`{json.dumps(list(default))}`"
    if isinstance(default, dict):
        return "`{}`" if not default else f"`{json.dumps(default)}`"
    if isinstance(default, str):
        return f'`"{default}"`'
    return f"`{default}`"


def _table(settings: Sequence[Setting], *, key_prefix: str = "") -> List[str]:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for s in settings:
        key = f"`{key_prefix}{s.name}`"
        if s.aliases:
            key += " (alias " + ", ".join(f"`{a}`" for a in s.aliases) + ")"
        meaning = s.help + (" Secret: never logged, masked by `lapidus -t`." if s.secret else "")
        lines.append(f"| {key} | {s.kind.doc} | {_default_doc(s)} | {meaning} |")
    return lines


def render_markdown() -> str:
    """The settings reference, generated from the declarations (:mod:`.sections`,
    :mod:`.backends`)."""
    out: List[str] = [DOC_BEGIN, ""]

    def section(title: str, settings: Sequence[Setting], intro: str = "") -> None:
        out.extend([f"### {title}", ""])
        if intro:
            out.extend([intro, ""])
        out.extend(_table(settings))
        out.append("")

    section("Top level", TOP_LEVEL)
    section("`[log]`", LOG)
    section("`[control]`", CONTROL)
    section("`[http]`", HTTP, "Leave the table out to serve no HTTP at all.")
    section("`[supervisor]`", SUPERVISOR)
    section("`[cluster]`", CLUSTER, "Leave the table out to run alone; see "
            "[cluster.md](cluster.md).")
    section("`[[backends]]`: every type", BACKEND_COMMON)
    for backend_type in BACKEND_TYPES:
        own = backend_settings(backend_type)[len(BACKEND_COMMON):]
        section(f"`[[backends]]` with `type = \"{backend_type}\"`", own)
    out.extend([
        "### Plugin options", "",
        "Each entry of `plugins` (global or per backend) is a table of that plugin's options; an "
        "empty table enables the plugin with its defaults. The original Lapidus spellings "
        + ", ".join(f"`{a}` (`{c}`)" for a, c in PLUGIN_ALIASES.items())
        + " are accepted there too. Built-in plugins: "
        + ", ".join(f"`{p}`" for p in BUILTIN_PLUGINS) + "; their options are documented with "
        "each sink.", "", DOC_END])
    return "\n".join(out) + "\n"


def update_doc(path: Path) -> bool:
    """Rewrite the generated part of ``path`` in place; True when it changed."""
    text = path.read_text()
    start, end = text.index(DOC_BEGIN), text.index(DOC_END) + len(DOC_END) + 1
    new = text[:start] + render_markdown() + text[end:]
    if new != text:
        path.write_text(new)
    return new != text
