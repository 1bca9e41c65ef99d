"""Filter push-down: the $match stage never disagrees with TableFilter where it decides.

The stage is evaluated here by a small interpreter for the few operators it uses, with Python's
``re`` for ``$regex`` (the generated expressions avoid everything where PCRE and Python differ).
"""

from __future__ import annotations

import itertools
import re

import pytest

from lapidus.filters import TableFilter
from lapidus.workers.mongo.pipeline import FILTERED_OPERATIONS, glob_regex, match_stage

NAMESPACES = [("shop", c) for c in (
    "items", "items_2023", "audit", "audit_log", "audit_", "sessions", "session", "a.b",
    "x.items", "Items", "tmp1", "tmp12", "tmp", "weird*name", "we?rd", "new\nline",
    "line\n", "")] + [("crm", "items"), ("crm", "audit_log"), ("shopping", "items"),
                      ("shop2", "audit")]

PATTERNS = ["items", "audit_*", "audit*", "tmp?", "*", "*.items", "shop.*", "shop.audit_*",
            "crm.items", "sho?.items", "a.b", "*log", "weird\\*name", "[st]ession*", "we?rd",
            "line", "Items"]


def matches(query, doc) -> bool:
    """Evaluate the subset of MongoDB query language match_stage produces."""
    for key, condition in query.items():
        if key == "$or":
            if not any(matches(q, doc) for q in condition):
                return False
        elif key == "$nor":
            if any(matches(q, doc) for q in condition):
                return False
        elif key == "$and":
            if not all(matches(q, doc) for q in condition):
                return False
        else:
            value = doc
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if isinstance(condition, dict) and "$regex" in condition:
                if not isinstance(value, str) or not re.search(condition["$regex"], value):
                    return False
            elif isinstance(condition, dict) and "$nin" in condition:
                if value in condition["$nin"]:
                    return False
            elif value != condition:
                return False
    return True


def change(db, coll, op="insert"):
    return {"operationType": op, "ns": {"db": db, "coll": coll}}


@pytest.mark.parametrize("glob", [p for p in PATTERNS if "[" not in p and "." not in p])
def test_glob_regex_agrees_with_fnmatch(glob):
    rx = glob_regex(glob)
    reference = TableFilter(include=[glob])
    for _, coll in NAMESPACES:
        assert bool(re.search(rx, coll)) == reference.allows("db", coll), (glob, coll)


def cases():
    for n in (1, 2):
        for combo in itertools.combinations(PATTERNS, n):
            yield list(combo), []
            yield [], list(combo)
    yield ["items", "audit_*"], ["audit_log"]
    yield ["shop.*"], ["*.items", "[st]ession*"]


def test_pushed_down_match_never_drops_what_the_filter_keeps():
    for include, exclude in cases():
        reference = TableFilter(include, exclude)
        stage = match_stage(include, exclude)
        for db, coll in NAMESPACES:
            if reference.allows(db, coll):
                assert stage is None or matches(stage["$match"], change(db, coll)), \
                    (include, exclude, db, coll)


@pytest.mark.parametrize("include, exclude", [
    (["items", "audit_*"], []), ([], ["sessions", "tmp?"]), (["shop.*"], ["shop.audit_*"]),
    (["crm.items", "*log"], ["audit"])])
def test_translatable_patterns_are_pushed_down_exactly(include, exclude):
    reference = TableFilter(include, exclude)
    stage = match_stage(include, exclude)["$match"]
    for db, coll in NAMESPACES:
        assert matches(stage, change(db, coll)) == reference.allows(db, coll), (db, coll)


def test_nothing_to_push_down():
    assert match_stage() is None
    assert match_stage(include=["[ab]*"]) is None          # character classes stay client-side
    assert match_stage(exclude=["*.items"]) is None        # wildcard in the database part


def test_an_untranslatable_include_disables_only_the_include():
    stage = match_stage(include=["items", "[ab]*"], exclude=["sessions"])["$match"]
    assert matches(stage, change("shop", "zzz"))            # include not pushed: superset
    assert not matches(stage, change("shop", "sessions"))  # exclude still pushed


@pytest.mark.parametrize("op", ["rename", "dropDatabase", "invalidate", "create", "modify"])
def test_database_level_and_unknown_operations_always_pass(op):
    stage = match_stage(include=["nothing"])["$match"]
    assert matches(stage, {"operationType": op, "ns": {"db": "shop", "coll": "x"}})
    assert matches(stage, {"operationType": op})


@pytest.mark.parametrize("op", FILTERED_OPERATIONS)
def test_collection_operations_are_filtered(op):
    stage = match_stage(exclude=["sessions"])["$match"]
    assert not matches(stage, change("shop", "sessions", op))
    assert matches(stage, change("shop", "items", op))
