"""sql92: RocketMQ 4.9.7's SQL92 selector, outcomes as its broker's ExpressionMessageFilter.

Expected values follow the Java sources (SelectorParser.jj, ComparisonExpression,
LogicExpression, UnaryExpression), including their quirks, which are noted where they
surprise.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idemp.remoting.sql92 import Selector, SelectorError, compile_selector


def matches(selector: str, **properties: str) -> bool:
    return compile_selector(selector).matches(properties)


def cases(*rows: tuple[str, dict[str, str], bool]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(("selector", "props", "expected"), rows)


# -- parse errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "position"),
    [
        ("", 0),
        ("   ", 3),
        ("a =", 3),
        ("a = 'x", 4),  # unterminated string
        ("a # 1", 2),
        ("a != 1", 2),
        ("a == 1", 3),
        ("a = 1 b", 6),  # RocketMQ ignores what follows; this module refuses it
        ("a = 1)", 5),
        ("(a = 1", 6),
        ("a = 1 AND", 9),
        ("AND a = 1", 0),
        ("a NOT LIKE 'x%'", 6),
        ("a LIKE 'x%'", 2),
        ("a IS 5", 5),
        ("a IS NOT 5", 9),
        ("a IN ()", 6),
        ("a IN ('x',)", 10),
        ("a IN (1, 2)", 6),
        ("a IN 'x'", 5),
        ("a BETWEEN 1 OR 2", 12),
        ("a BETWEEN 1", 11),
        ("/* never closed", 0),
        ("a = 1 --", 6),  # "--" is a comment only up to a line end; here, two minus signs
        ("a = .", 4),
        ("a = 1\x0b", 5),  # only space, tab, CR, LF and FF are blanks
        ("a = 'x' OR", 10),
        ("1a = 'x'", 1),  # identifiers start with a letter, '_' or '$'
        ("a.b = 'x'", 1),
        ("a = 0L", 5),  # the L suffix needs a non-zero number
        ("NOT", 3),
    ],
)
def test_syntax_errors_name_the_position(selector: str, position: int) -> None:
    with pytest.raises(SelectorError) as err:
        compile_selector(selector)
    assert err.value.position == position
    assert f"column {position + 1}:" in str(err.value)


@pytest.mark.parametrize(
    ("selector", "position"),
    [
        ("5", 0),  # ParseException: will not result in a boolean value
        ("'x'", 0),
        ("-a", 0),
        ("a = 1 AND 5", 10),
        ("5 OR a = 1", 0),
        ("NOT 5", 4),
        ("a > 'x'", 4),  # checkLessThanOperand: only numbers can be ordered
        ("'x' < a", 0),
        ("a > TRUE", 4),
        ("a >= NULL", 5),
        ("NOT a > 1", 0),  # NOT binds tighter: (NOT a) > 1
        ("a > 1 > 2", 0),
        ("(a > 1) < 2", 1),
        ("a = NULL", 4),  # checkEqualOperand
        ("NULL <> a", 0),
        ("TRUE = 1", 0),  # checkEqualOperandCompatability, one way only
        ("FALSE = 'false'", 0),
        ("'x' IN ('x')", 0),  # IN needs a property
        ("NOT a IN ('x')", 0),
        ("a IN ('x') IN ('y')", 0),
        ("a BETWEEN 10 AND 2", 10),
        ("a BETWEEN 2.5 AND 2", 10),
        ("a BETWEEN NULL AND 2", 10),
        ("a BETWEEN 1 AND NULL", 10),
        ("a BETWEEN 'a' AND 'b'", 10),
        ("a BETWEEN TRUE AND TRUE", 10),
        ("a > 9223372036854775808", 4),  # Long overflow
        ("a > 100000000000000000000000", 4),
        ("a = -9223372036854775808", 5),  # the sign is a separate operator
        ("a > 1e400", 4),
        ("a > 0.0", 4),  # createFloat refuses anything below Double.MIN_VALUE, 0.0 included
        ("a > .0e5", 4),
        ("a > 1e-400", 4),
        ("a = 0x1F", 5),  # no hex and no octal in 4.9.7: "0" then "x1F"
        ("a = 017", 5),
        ("a = 00", 5),
    ],
)
def test_semantic_and_literal_errors(selector: str, position: int) -> None:
    with pytest.raises(SelectorError) as err:
        compile_selector(selector)
    assert err.value.position == position


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("", "invalid SQL92 selector at column 1: expected a value, found end of selector"),
        ("a = 'x", "invalid SQL92 selector at column 5: unterminated string literal"),
        ("a != 1", "invalid SQL92 selector at column 3: unexpected character '!'"),
        (
            "a = 1 b",
            "invalid SQL92 selector at column 7: unexpected 'b' after a complete expression",
        ),
        (
            "a = 0x1F",
            "invalid SQL92 selector at column 6: unexpected 'x1F' after a complete expression"
            " (RocketMQ 4.9.7 has no hex or octal literals)",
        ),
        ("(a = 1", "invalid SQL92 selector at column 7: expected ')', found end of selector"),
        (
            "a > 'x'",
            "invalid SQL92 selector at column 5: > needs numbers or properties, not \"'x'\"",
        ),
        (
            "a = NULL",
            "invalid SQL92 selector at column 5: = cannot compare with NULL; use IS [NOT] NULL",
        ),
        ("a = 1 AND 5", "invalid SQL92 selector at column 11: '5' is not a condition"),
        (
            "a BETWEEN 10 AND 2",
            "invalid SQL92 selector at column 11:"
            " BETWEEN's lower bound '10' is above its upper bound '2'",
        ),
        (
            "a > 0.0",
            "invalid SQL92 selector at column 5:"
            " number 0.0 is below 4.9E-324, which RocketMQ refuses (write 0 for zero)",
        ),
        (
            "a IN ('x', 1)",
            "invalid SQL92 selector at column 12:"
            " expected a string literal in the IN list, found '1'",
        ),
        (
            "a = 'x'\n  AND",
            "invalid SQL92 selector at line 2, column 6: expected a value, found end of selector",
        ),
    ],
)
def test_error_messages(selector: str, message: str) -> None:
    with pytest.raises(SelectorError) as err:
        compile_selector(selector)
    assert str(err.value) == message


def test_selector_error_is_a_value_error() -> None:
    assert issubclass(SelectorError, ValueError)


# -- each operator, on strings that hold numbers -----------------------------------------


@cases(
    ("a = 10", {"a": "10"}, True),
    ("a = 11", {"a": "10"}, False),
    ("a <> 10", {"a": "10"}, False),
    ("a <> 11", {"a": "10"}, True),
    ("a > 5", {"a": "10"}, True),
    ("a > 10", {"a": "10"}, False),
    ("a >= 10", {"a": "10"}, True),
    ("a >= 11", {"a": "10"}, False),
    ("a < 11", {"a": "10"}, True),
    ("a < 10", {"a": "10"}, False),
    ("a <= 10", {"a": "10"}, True),
    ("a <= 9", {"a": "10"}, False),
    ("5 < a", {"a": "10"}, True),
    ("10 = a", {"a": "10"}, True),
    ("5 > 3", {}, True),  # literals alone
    ("3 >= 3.5", {}, False),
    ("1 = 1.0", {}, True),
)
def test_each_operator(selector: str, props: dict[str, str], expected: bool) -> None:
    assert matches(selector, **props) is expected


# -- strings against numbers, converted as ComparisonExpression does ---------------------


@cases(
    ("a = '10'", {"a": "10"}, True),  # string to string: exact text
    ("a = '10.0'", {"a": "10"}, False),
    ("a = 10.0", {"a": "10"}, True),  # against a Double: Double.valueOf
    ("a > 9.5", {"a": "10"}, True),
    # against an Integer literal the string goes through Integer.valueOf ...
    ("a > 5", {"a": "10.5"}, False),  # NumberFormatException: dropped
    ("a < 50", {"a": "10.5"}, False),
    ("a > 5.0", {"a": "10.5"}, True),
    ("a = 10", {"a": " 10"}, False),  # no trimming for integers ...
    ("a = 10.0", {"a": " 10 "}, True),  # ... but Double.valueOf trims
    ("a = 10", {"a": "+10"}, True),
    ("a = 10", {"a": "0010"}, True),
    ("a = 0", {"a": "-0"}, True),
    ("a = 10", {"a": "1e1"}, False),
    ("a = 10", {"a": "10L"}, False),
    ("a = 10", {"a": "\u0661\u0660"}, True),  # Java reads any Unicode decimal digit
    ("a = 10.0", {"a": "\u0661\u0660"}, False),  # but Double.valueOf only ASCII ones
    ("a = 10", {"a": "1_0"}, False),
    # ... which is 32-bit: a larger value only compares against a Long literal
    ("a > 5", {"a": "3000000000"}, False),
    ("a > 2147483648", {"a": "3000000000"}, True),
    ("a > 5.0", {"a": "3000000000"}, True),
    ("a = 5L", {"a": "5"}, True),  # the suffix is dropped and 5 fits an Integer
    ("a = 2147483648", {"a": "2147483648"}, True),
    # Double.valueOf's own syntax
    ("a = 10.0", {"a": "10d"}, True),
    ("a = 10.0", {"a": "10f"}, True),
    ("a = 16.0", {"a": "0x10p0"}, True),
    ("a = 16.0", {"a": "0x10"}, False),  # a hex double needs its exponent
    ("a > 1.5", {"a": "NaN"}, True),  # Double.compareTo puts NaN above everything
    ("a < 1.5", {"a": "NaN"}, False),
    ("a = 1.5", {"a": "NaN"}, False),
    ("a > 1.5", {"a": "Infinity"}, True),
    ("a > 1.5", {"a": "inf"}, False),  # Python's float() would accept it; Java does not
    ("a = 1000.0", {"a": "1_000"}, False),
    # a non-numeric string against a number is an error, so never a match
    ("a = 10", {"a": "abc"}, False),
    ("a <> 10", {"a": "abc"}, False),
    ("a = 'abc'", {"a": "abc"}, True),
    ("a <> 'x'", {"a": "abc"}, True),
    # two properties: = compares text, ordering compares them as doubles
    ("a > b", {"a": "10", "b": "9"}, True),
    ("a < b", {"a": "10", "b": "9"}, False),
    ("a = b", {"a": "1.0", "b": "1"}, False),
    ("a >= b", {"a": "1.0", "b": "1"}, True),
    ("a > b", {"a": "x", "b": "1"}, False),
    ("a < b", {"a": "-0.0", "b": "0.0"}, True),  # Double.compareTo: -0.0 < 0.0
    ("a = b", {"a": "-0.0", "b": "0.0"}, False),
)
def test_string_number_conversions(selector: str, props: dict[str, str], expected: bool) -> None:
    assert matches(selector, **props) is expected


@cases(
    ("a = TRUE", {"a": "true"}, True),
    ("a = TRUE", {"a": "TRUE"}, True),  # Boolean.valueOf ignores case
    ("a = TRUE", {"a": "yes"}, False),
    ("a = FALSE", {"a": "yes"}, True),  # anything but "true" reads as false
    ("a <> TRUE", {"a": "false"}, True),
    ("TRUE = a", {"a": "true"}, False),  # a ClassCastException in RocketMQ, so dropped
    ("TRUE = a", {}, False),
    ("'true' = TRUE", {}, True),
    ("1 = TRUE", {}, False),  # allowed this way round, and never equal
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("TRUE = TRUE", {}, True),
    ("TRUE <> FALSE", {}, True),
    ("NOT FALSE", {}, True),
    ("NULL", {}, False),
    ("NOT NULL", {}, False),
    ("(a > 1) = TRUE", {"a": "2"}, True),
    ("a > 1 = FALSE", {"a": "2"}, False),
)
def test_boolean_literals(selector: str, props: dict[str, str], expected: bool) -> None:
    assert matches(selector, **props) is expected


# -- missing properties: NULL and three-valued logic -------------------------------------


@cases(
    ("a > 5", {}, False),
    ("NOT (a > 5)", {}, False),  # NOT unknown is unknown
    ("a = 'x'", {}, False),
    ("a <> 'x'", {}, False),
    ("a IS NULL", {}, True),
    ("a IS NULL", {"a": ""}, False),  # an empty value is still a value
    ("a IS NOT NULL", {}, False),
    ("a IS NOT NULL", {"a": ""}, True),
    ("NOT (a IS NULL)", {}, False),
    ("(a > 5) IS NULL", {}, True),
    ("(a > 5) IS NOT NULL", {"a": "6"}, True),
    ("a IS NULL IS NULL", {}, False),
    ("NULL IS NULL", {}, True),
    ("5 IS NOT NULL", {}, True),
    # RocketMQ's equality is not symmetric about null
    ("a = b", {}, True),  # null = null is TRUE
    ("a = b", {"b": "x"}, False),  # null = x is unknown
    ("a <> b", {"b": "x"}, False),
    ("a = b", {"a": "x"}, False),  # x = null is FALSE ...
    ("a <> b", {"a": "x"}, True),  # ... so its negation is TRUE
    # a property used as a condition: null when absent, FALSE otherwise
    ("a", {"a": "true"}, False),
    ("a", {}, False),
    ("NOT a", {"a": "x"}, True),
    ("NOT a", {}, False),
    ("a OR b = '1'", {"b": "1"}, True),
    # NOT binds tighter than =: (NOT a) = 'x' compares a Boolean with a string, an error
    ("NOT a = 'x'", {"a": "y"}, False),
    ("NOT a = 'x'", {"a": "x"}, False),
    ("NOT (a = 'x')", {"a": "y"}, True),
    # a negated string is null
    ("-a IS NULL", {"a": "5"}, True),
    ("-a > 5", {"a": "-10"}, False),
)
def test_null_semantics(selector: str, props: dict[str, str], expected: bool) -> None:
    assert matches(selector, **props) is expected


@cases(
    ("a > 5 OR b = 'x'", {"b": "x"}, True),  # unknown OR TRUE
    ("a > 5 OR b = 'x'", {"b": "y"}, False),  # unknown OR FALSE is unknown
    ("NOT (a > 5 OR b = 'x')", {"b": "y"}, False),
    ("NOT (a > 5 OR b = 'x')", {"a": "1", "b": "y"}, True),
    ("a > 5 AND b = 'x'", {"b": "x"}, False),  # unknown AND TRUE is unknown
    ("NOT (a > 5 AND b = 'x')", {"b": "x"}, False),
    ("NOT (a > 5 AND b = 'y')", {"b": "x"}, True),  # unknown AND FALSE is FALSE
    ("NOT (b = 'y' AND a > 5)", {"b": "x"}, True),
    # evaluation stops at the first deciding operand, so a later error does not count ...
    ("b = 'x' OR a = 10", {"a": "abc", "b": "x"}, True),
    ("NOT (b = 'y' AND a = 10)", {"a": "abc", "b": "x"}, True),
    # ... but an earlier one drops the message, whatever the rest says
    ("a = 10 OR b = 'x'", {"a": "abc", "b": "x"}, False),
    ("NOT (a = 10 AND b = 'y')", {"a": "abc", "b": "x"}, False),
    ("c > 1 OR a = 10 OR b = 'x'", {"a": "abc", "b": "x"}, False),  # unknown decides nothing
    # AND binds tighter than OR
    ("a = '1' OR b = '1' AND c = '1'", {"a": "1", "b": "0", "c": "0"}, True),
    ("(a = '1' OR b = '1') AND c = '1'", {"a": "1", "b": "0", "c": "0"}, False),
    ("a = '1' AND b = '1' OR c = '1'", {"a": "0", "b": "0", "c": "1"}, True),
    ("a = '1' AND (b = '1' OR c = '1')", {"a": "0", "b": "0", "c": "1"}, False),
    ("NOT a = '1' OR TRUE", {}, True),
    ("a=3 and b<>4 And c>5 AND d<=4", {"a": "3", "b": "5", "c": "6", "d": "1"}, True),
    ("a=3 and b<>4 And c>5 AND d<=4", {"a": "4", "b": "5", "c": "6", "d": "1"}, False),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "4", "c": "3", "d": "10"}, False),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "4", "c": "3", "d": "2"}, True),
)
def test_and_or(selector: str, props: dict[str, str], expected: bool) -> None:
    assert matches(selector, **props) is expected


def test_a_long_chain_does_not_nest() -> None:
    chain = " AND ".join(["a = '1'"] * 2000)
    assert matches(chain, a="1") is True
    assert matches(" OR ".join(["a = '2'"] * 2000) + " OR a = '1'", a="1") is True


def test_nesting_is_bounded() -> None:
    assert matches("(" * 100 + "a = '1'" + ")" * 100, a="1") is True
    assert matches("NOT " * 99 + "a", a="x") is True  # NOT over a present property's FALSE
    assert matches("NOT " * 100 + "a", a="x") is False
    with pytest.raises(SelectorError) as err:
        compile_selector("(" * 101 + "a = '1'" + ")" * 101)
    assert err.value.position == 101  # the operand inside the 101st parenthesis
    assert str(err.value).endswith(": nested more than 100 levels deep")


# -- IN, BETWEEN -------------------------------------------------------------------------


@cases(
    ("a IN ('x', 'y')", {"a": "y"}, True),
    ("a IN ('x', 'y')", {"a": "z"}, False),
    ("a IN ('x', 'y')", {"a": "X"}, False),
    ("a IN ('x', 'y')", {}, False),
    ("a NOT IN ('x', 'y')", {"a": "z"}, True),
    ("a NOT IN ('x', 'y')", {"a": "x"}, False),
    ("a NOT IN ('x', 'y')", {}, False),  # unknown, like NOT (a IN ...)
    ("NOT (a IN ('x'))", {}, False),
    ("a IN ('10')", {"a": "10.0"}, False),  # IN compares text, never numbers
    ("a IN ('1', '2', '3', '4', '5', '6')", {"a": "6"}, True),
    ("(a) IN ('x')", {"a": "x"}, True),
    ("a IN ('it''s')", {"a": "it's"}, True),
    ("a IN ('x') AND b NOT IN ('x')", {"a": "x", "b": "y"}, True),
)
def test_in(selector: str, props: dict[str, str], expected: bool) -> None:
    assert matches(selector, **props) is expected


@cases(
    ("a BETWEEN 2 AND 10", {"a": "2"}, True),
    ("a BETWEEN 2 AND 10", {"a": "10"}, True),
    ("a BETWEEN 2 AND 10", {"a": "3"}, True),
    ("a BETWEEN 2 AND 10", {"a": "1"}, False),
    ("a BETWEEN 2 AND 10", {"a": "11"}, False),
    ("a BETWEEN 2 AND 10", {}, False),
    ("a BETWEEN 2 AND 10", {"a": "abc"}, False),
    ("a BETWEEN 2 AND 10", {"a": "5.5"}, False),  # Integer bounds: Integer.valueOf fails
    ("a BETWEEN 2.0 AND 10", {"a": "5.5"}, False),  # each bound converts on its own
    ("a BETWEEN 2.0 AND 10.0", {"a": "5.5"}, True),
    ("a BETWEEN 1.5 AND 2.5", {"a": "2"}, True),
    ("a BETWEEN 1 AND 1", {"a": "1"}, True),
    ("a NOT BETWEEN 2 AND 10", {"a": "1"}, True),
    ("a NOT BETWEEN 2 AND 10", {"a": "11"}, True),
    ("a NOT BETWEEN 2 AND 10", {"a": "5"}, False),
    ("a NOT BETWEEN 2 AND 10", {}, False),
    ("a BETWEEN -5 AND -10", {"a": "-7"}, False),  # negations escape the bounds check
    ("a BETWEEN -10 AND -5", {"a": "-7"}, True),
    ("a NOT BETWEEN 10 AND 2", {"a": "5"}, True),  # NOT BETWEEN has no bounds check
    ("a BETWEEN b AND c", {"a": "5", "b": "1", "c": "9"}, True),
    ("a BETWEEN 1 AND 2 AND b = 'x'", {"a": "1", "b": "x"}, True),
    ("a BETWEEN 1 AND 2 OR b = 'x'", {"a": "3", "b": "x"}, True),
)
def test_between(selector: str, props: dict[str, str], expected: bool) -> None:
    assert matches(selector, **props) is expected


# -- literals, keywords, identifiers, comments -------------------------------------------


@cases(
    ("a = 5.", {"a": "5"}, True),
    ("a = .5", {"a": "0.5"}, True),
    ("a = 1e3", {"a": "1000"}, True),
    ("a = 1.5E+2", {"a": "150"}, True),
    ("a > 3.1E10", {"a": "31415000000.0"}, True),
    ("a < 1e-3", {"a": "0.0005"}, True),
    ("a = 0", {"a": "0"}, True),
    ("a = -5", {"a": "-5"}, True),
    ("a = - 5", {"a": "-5"}, True),
    ("a = +5", {"a": "5"}, True),
    ("a = --5", {"a": "5"}, True),  # no line end after "--": two minus signs
    ("a = - -5", {"a": "5"}, True),
    ("a = -2147483648", {"a": "-2147483648"}, True),  # a Long, negated
    ("a = -9223372036854775807", {"a": "-9223372036854775807"}, True),
    ("a = 9223372036854775807L", {"a": "9223372036854775807"}, True),
    ("a = -1.5", {"a": "-1.5"}, True),
    ("a = 'it''s'", {"a": "it's"}, True),
    ("a = ''''", {"a": "'"}, True),
    ("a = ''", {"a": ""}, True),
    ("a = 'x''''y'", {"a": "x''y"}, True),
    ("a = 'two\nlines'", {"a": "two\nlines"}, True),
    ("a = 'h\u00e9llo \u2713'", {"a": "h\u00e9llo \u2713"}, True),
    ("TAGS is not null and TAGS='''''tag'''''", {"TAGS": "''tag''"}, True),
)
def test_literals(selector: str, props: dict[str, str], expected: bool) -> None:
    assert matches(selector, **props) is expected


def test_a_comment_needs_its_line_end() -> None:
    with pytest.raises(SelectorError):
        compile_selector("a = --5\n")  # here "--5" is a comment, leaving "a ="


@cases(
    ("a = '1' and b = '2' Or c iS nOt NuLl", {"a": "1", "b": "2"}, True),
    ("a between 1 AnD 2", {"a": "2"}, True),
    ("a not in ('x') and not (b Is Null)", {"a": "y", "b": "z"}, True),
    ("true", {}, True),
    ("False Or True", {}, True),
    ("a is null", {}, True),
    ("A = '1'", {"a": "1"}, False),  # property names keep their case
    ("A = '1'", {"A": "1"}, True),
    ("$a_1 = 'x'", {"$a_1": "x"}, True),
    ("_ = 'x'", {"_": "x"}, True),
    # words that only start with a keyword are identifiers
    (
        "notes = 'x' AND ISO = 'y' AND INx = 'z' AND ORDER = '1' AND nullable = '0'",
        {"notes": "x", "ISO": "y", "INx": "z", "ORDER": "1", "nullable": "0"},
        True,
    ),
    ("now >= 1", {"now": "2"}, True),  # NOW is no keyword in 4.9.7
    # blanks and comments
    ("a\t=\r\n'1'\f", {"a": "1"}, True),
    ("/* lead */ a = /* mid */ '1' -- trailing\n", {"a": "1"}, True),
    ("a = '1' -- trailing\r", {"a": "1"}, True),
    ("/**/a/***/=/* ** */'1'", {"a": "1"}, True),
    ("a = '/* not a comment */'", {"a": "/* not a comment */"}, True),
    ("a='1'AND(b='2')", {"a": "1", "b": "2"}, True),
)
def test_keywords_identifiers_blanks(selector: str, props: dict[str, str], expected: bool) -> None:
    assert matches(selector, **props) is expected


# -- TAGS, as the broker's context holds it ----------------------------------------------


@cases(
    ("TAGS = 'TagA'", {"TAGS": "TagA", "KEYS": "k1"}, True),
    ("TAGS = 'TagA'", {"TAGS": "TagB"}, False),
    ("TAGS = 'TagA'", {}, False),
    ("TAGS IN ('TagA', 'TagB') AND price > 100", {"TAGS": "TagB", "price": "150"}, True),
    ("TAGS IN ('TagA', 'TagB') AND price > 100", {"TAGS": "TagB", "price": "99"}, False),
    ("TAGS IS NULL", {"KEYS": "k1"}, True),
    ("TAGS <> 'TagA'", {}, False),
)
def test_tags(selector: str, props: dict[str, str], expected: bool) -> None:
    assert matches(selector, **props) is expected


# -- the compiled object -----------------------------------------------------------------


def test_compiled_once_matches_many() -> None:
    selector = compile_selector("a > 5 AND TAGS = 'x'")
    assert isinstance(selector, Selector)
    assert selector.text == "a > 5 AND TAGS = 'x'"
    assert repr(selector) == "Selector(\"a > 5 AND TAGS = 'x'\")"
    outcomes = [
        selector.matches({"a": "6", "TAGS": "x"}),
        selector.matches({"a": "5", "TAGS": "x"}),
        selector.matches({"a": "oops", "TAGS": "x"}),
        selector.matches({"TAGS": "x"}),
        selector.matches({"a": "6", "TAGS": "x", "other": "1"}),
    ]
    assert outcomes == [True, False, False, False, True]


# -- properties --------------------------------------------------------------------------

INT64 = st.integers(-(2**63) + 1, 2**63 - 1)
ORDERS: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "<>": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
MIRROR = {"=": "=", "<>": "<>", ">": "<", ">=": "<=", "<": ">", "<=": ">="}


@settings(max_examples=300, deadline=None)
@given(
    INT64 | st.integers(-(2**31), 2**31 - 1),
    INT64 | st.integers(-50, 50),
    st.sampled_from(list(ORDERS)),
)
def test_integers_compare_as_java_does(value: int, literal: int, op: str) -> None:
    # An Integer literal (|n| < 2**31) reads the property with Integer.valueOf, so a value
    # beyond 32 bits is an error there; a Long literal reads it with Long.valueOf.
    readable = abs(literal) > 2**31 - 1 or -(2**31) <= value <= 2**31 - 1
    expected = readable and ORDERS[op](value, literal)
    props = {"x": str(value)}
    assert compile_selector(f"x {op} {literal}").matches(props) is expected
    assert compile_selector(f"{literal} {MIRROR[op]} x").matches(props) is expected
    # against a Double literal the property is parsed as a double, whatever its size
    as_double = float(f"{literal}.5")
    selector = compile_selector(f"x {op} {literal}.5")
    assert selector.matches(props) is ORDERS[op](float(value), as_double)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_any_string_literal_round_trips(text: str) -> None:
    quoted = "'" + text.replace("'", "''") + "'"
    selector = compile_selector(f"x = {quoted} AND x IN ({quoted}, 'other')")
    assert selector.matches({"x": text}) is True
    assert selector.matches({"x": text + "!"}) is False


PIECES = st.sampled_from(
    [
        "a",
        "b",
        "TAGS",
        "'x'",
        "'1'",
        "1",
        "2.5",
        "0",
        "-",
        "+",
        "(",
        ")",
        ",",
        "=",
        "<>",
        ">",
        ">=",
        "<",
        "<=",
        "AND",
        "OR",
        "NOT",
        "IS",
        "NULL",
        "TRUE",
        "FALSE",
        "IN",
        "BETWEEN",
        "--",
        "/*",
        "*/",
        "\n",
        "''",
        "#",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(PIECES, max_size=14),
    st.dictionaries(
        st.sampled_from(["a", "b", "TAGS"]), st.sampled_from(["1", "2.5", "x", "", "true", "NaN"])
    ),
)
def test_any_token_soup_compiles_or_fails_cleanly(pieces: list[str], props: dict[str, str]) -> None:
    try:
        selector = compile_selector(" ".join(pieces))
    except SelectorError:
        return
    assert selector.matches(props) in (True, False)
