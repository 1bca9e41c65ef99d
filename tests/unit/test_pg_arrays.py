"""PostgreSQL array text output -> nested lists (lapidus.workers.postgresql.arrays).  No server.

Every input below is text PostgreSQL 15 printed (``select '...'::text[]``, arrays as wal2json
and pgoutput send them), except the malformed ones.
"""

from __future__ import annotations

import pytest

from lapidus.workers.postgresql.arrays import parse_array


@pytest.mark.parametrize("text, expected", [
    ("{1,2,3}", ["1", "2", "3"]),
    ("{}", []),
    ("{42}", ["42"]),
    ("{NULL}", [None]),
    ("{1,NULL,3}", ["1", None, "3"]),
    ('{NULL,"NULL"}', [None, "NULL"]),
    ('{""}', [""]),
    ('{"",a,""}', ["", "a", ""]),
    ("{1.50,NaN,-Infinity,12345678901234567890.000000001}",
     ["1.50", "NaN", "-Infinity", "12345678901234567890.000000001"]),
    ("{2026-11-30,infinity}", ["2026-11-30", "infinity"]),
    ("{t,f}", ["t", "f"]),
])
def test_flat_arrays(text, expected):
    assert parse_array(text) == expected


def test_quoting_and_escapes_as_postgresql_prints_them():
    # select '{"a b","c,d","x\"y","back\\slash",NULL,"NULL",""," lead","{br}"}'::text[]
    text = r'{"a b","c,d","x\"y","back\\slash",NULL,"NULL",""," lead","{br}"}'
    assert parse_array(text) == ["a b", "c,d", 'x"y', "back\\slash", None, "NULL", "",
                                 " lead", "{br}"]


def test_quoted_null_in_any_case_is_a_string_and_bare_null_in_any_case_is_null():
    assert parse_array('{"null","Null",NULL}') == ["null", "Null", None]
    assert parse_array("{null,Null}") == [None, None]      # array_in accepts these spellings


def test_elements_with_braces_quotes_and_newlines():
    assert parse_array('{"}","{","{a,b}","line\nbreak","tab\there"}') == [
        "}", "{", "{a,b}", "line\nbreak", "tab\there"]


def test_non_ascii_elements():
    assert parse_array('{é,"☃ snow"}') == ["é", "☃ snow"]


def test_nested_arrays():
    assert parse_array("{{1,2},{3,4}}") == [["1", "2"], ["3", "4"]]
    assert parse_array("{{{1},{2}},{{3},{4}}}") == [[["1"], ["2"]], [["3"], ["4"]]]
    assert parse_array('{{a,b},{NULL,"}"}}') == [["a", "b"], [None, "}"]]


def test_arrays_of_quoted_elements_that_are_themselves_arrays():
    # An array over a domain over int[]: each element is one inner array as text.
    assert parse_array('{"{3,4}"}') == ["{3,4}"]


@pytest.mark.parametrize("text, expected", [
    ("[0:2]={1,2,3}", ["1", "2", "3"]),
    ('[-2:0]={a,"b c",NULL}', ["a", "b c", None]),
    ("[0:1][5:6]={{1,2},{3,4}}", [["1", "2"], ["3", "4"]]),
])
def test_dimension_decoration_is_dropped(text, expected):
    assert parse_array(text) == expected


def test_semicolon_delimiter_of_box():
    # select array[box '((1,2),(3,4))', box '((0,0),(-1.5,2))']
    assert parse_array("{(3,4),(1,2);(0,2),(-1.5,0)}", ";") == ["(3,4),(1,2)", "(0,2),(-1.5,0)"]
    assert parse_array('{"a;b";NULL}', ";") == ["a;b", None]
    assert parse_array("{{(1,1),(0,0)};{(2,2),(1,1)}}", ";") == [["(1,1),(0,0)"],
                                                                ["(2,2),(1,1)"]]


def test_composite_elements_keep_their_own_quoting():
    # select array['(1,x)'::pair, '(2,"a,b")'::pair]
    assert parse_array(r'{"(1,x)","(2,\"a,b\")"}') == ["(1,x)", '(2,"a,b")']


def test_bytea_and_jsonb_elements():
    assert parse_array(r'{"\\x00ff","\\x"}') == ["\\x00ff", "\\x"]
    assert parse_array(r'{"{\"k\": [1, 2.50]}"}') == ['{"k": [1, 2.50]}']


def test_white_space_around_elements_is_ignored_as_array_in_does():
    assert parse_array("{ a , b }") == ["a", "b"]
    assert parse_array('{ "a" , NULL }') == ["a", None]
    assert parse_array("{ {1} , {2} }") == [["1"], ["2"]]


@pytest.mark.parametrize("text, reason", [
    ("", "expected {...}"),
    ("1,2", "expected {...}"),
    ("{1,2", "expected {...}"),
    ("1,2}", "expected {...}"),
    ("{1} x", "expected {...}"),
    ("{1}}", "text after the closing brace"),
    ("{1,,2}", "empty unquoted element"),
    ("{,}", "empty unquoted element"),
    ("{1,}", "empty unquoted element"),
    ("{1,{2}}", "mixed elements and sub-arrays"),
    ("{{1},2}", "mixed elements and sub-arrays"),
    ('{"a"b}', "unexpected"),
    ('{"a}', "unexpected character"),
    ('{a"b}', "unexpected character"),
    ("{{1,2}", "unterminated"),
    ("[0:2]{1}", "bad dimension decoration"),
    ("[x]={1}", "bad dimension decoration"),
])
def test_malformed_input_raises_value_error_naming_the_problem(text, reason):
    with pytest.raises(ValueError, match="malformed array") as raised:
        parse_array(text)
    assert reason in str(raised.value)
