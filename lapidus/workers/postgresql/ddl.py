"""PostgreSQL schema changes as ``schema`` events, in commit order with the data.

Runs in the PostgreSQL worker process (the decoder calls it), except :func:`install_sql`,
which ``lapidusctl install-ddl-capture`` prints or runs.

Two sources, both inside the stream, so a schema event sits exactly where the change happened:

* **DDL capture** (installed by ``lapidusctl install-ddl-capture``): event triggers on
  ``ddl_command_end`` and ``sql_drop`` emit a transactional logical message with prefix
  ``lapidus-ddl`` whose content is JSON: the command tag, the object type and identity, for a
  table its schema, name and columns, and the statement (``current_query()``).  It commits
  with the DDL, so it is decoded in the DDL's own transaction.
* **Relation messages** (always on): pgoutput describes a table again before its first change
  after DDL; a description whose columns differ from the one before gives a schema event with
  the columns added, dropped and retyped (``"source": "relation"``), unless the DDL capture
  already announced that table.  It comes with the first change after the DDL, not with the
  DDL itself.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: the prefix of the logical messages the DDL capture's event triggers emit
DDL_PREFIX = "lapidus-ddl"

_FUNCTION = "lapidus_emit_ddl"
_TRIGGERS = ("lapidus_ddl_command_end", "lapidus_ddl_sql_drop")


def install_sql(schema: str = "public") -> str:
    """The SQL that installs (or replaces) the DDL capture in one database; idempotent.

    Event triggers need a superuser (on managed services, their own admin role where they
    allow event triggers at all)."""
    function = f'"{schema}".{_FUNCTION}'
    return f"""-- Lapidus DDL capture: schema changes become schema events, in commit order.
CREATE OR REPLACE FUNCTION {function}() RETURNS event_trigger
LANGUAGE plpgsql AS $lapidus$
DECLARE
  r record;
  rel record;
  columns jsonb;
BEGIN
  IF TG_EVENT = 'ddl_command_end' THEN
    FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
      columns := NULL;
      rel := NULL;
      IF r.classid = 'pg_class'::regclass AND r.object_type IN ('table', 'table column') THEN
        SELECT n.nspname, c.relname INTO rel FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = r.objid;
        SELECT jsonb_agg(jsonb_build_object(
                 'name', a.attname, 'type', format_type(a.atttypid, a.atttypmod),
                 'nullable', NOT a.attnotnull) ORDER BY a.attnum)
          INTO columns FROM pg_attribute a
          WHERE a.attrelid = r.objid AND a.attnum > 0 AND NOT a.attisdropped;
      END IF;
      PERFORM pg_logical_emit_message(true, '{DDL_PREFIX}', jsonb_build_object(
        'command', r.command_tag, 'object_type', r.object_type,
        'object', r.object_identity, 'schema', COALESCE(rel.nspname, r.schema_name),
        'table', rel.relname, 'columns', columns, 'sql', current_query())::text);
    END LOOP;
  ELSE
    FOR r IN SELECT * FROM pg_event_trigger_dropped_objects() WHERE original LOOP
      PERFORM pg_logical_emit_message(true, '{DDL_PREFIX}', jsonb_build_object(
        'command', TG_TAG, 'object_type', r.object_type, 'object', r.object_identity,
        'schema', r.schema_name,
        'table', CASE WHEN r.object_type = 'table' THEN r.object_name END,
        'columns', NULL, 'sql', current_query())::text);
    END LOOP;
  END IF;
END
$lapidus$;
DROP EVENT TRIGGER IF EXISTS {_TRIGGERS[0]};
CREATE EVENT TRIGGER {_TRIGGERS[0]} ON ddl_command_end EXECUTE FUNCTION {function}();
DROP EVENT TRIGGER IF EXISTS {_TRIGGERS[1]};
CREATE EVENT TRIGGER {_TRIGGERS[1]} ON sql_drop EXECUTE FUNCTION {function}();
"""


def uninstall_sql(schema: str = "public") -> str:
    return (f"DROP EVENT TRIGGER IF EXISTS {_TRIGGERS[0]};\n"
            f"DROP EVENT TRIGGER IF EXISTS {_TRIGGERS[1]};\n"
            f'DROP FUNCTION IF EXISTS "{schema}".{_FUNCTION}();\n')


def ddl_change(content: Optional[str]) -> Optional[Tuple[Optional[str], Optional[str], dict]]:
    """``(schema, table, item)`` of a DDL capture message; None for one that does not parse
    (a message of that prefix that this version did not write)."""
    try:
        fields = json.loads(content or "")
    except ValueError:
        return None
    if not isinstance(fields, dict):
        return None
    item = {key: fields.get(key) for key in ("command", "object_type", "object", "columns",
                                             "sql")}
    item["source"] = "ddl_capture"
    return fields.get("schema"), fields.get("table"), item


def relation_diff(name_before: str, columns_before: Sequence[Tuple[str, str]],
                  name_after: str, columns_after: Sequence[Tuple[str, str]]) -> Optional[dict]:
    """The ``item`` of a schema event from two descriptions (``schema.table`` and its
    ``(column, type)`` list) of one table, or None when nothing changed."""
    before, after = dict(columns_before), dict(columns_after)
    if name_before == name_after and list(before.items()) == list(after.items()):
        return None
    columns: List[Dict[str, Any]] = [{"name": n, "type": t} for n, t in after.items()]
    item = {"command": "ALTER TABLE", "object_type": "table", "object": name_after,
            "columns": columns, "sql": None, "source": "relation",
            "added": [n for n in after if n not in before],
            "dropped": [n for n in before if n not in after],
            "retyped": [n for n in after if n in before and before[n] != after[n]]}
    if name_before != name_after:
        item["renamed_from"] = name_before
    return item
