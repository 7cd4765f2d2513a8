"""RocketMQ 4.9.7's SQL92 message selector, evaluated as its broker evaluates it.

A consumer subscribing with ``MessageSelector.bySql(...)`` sends the expression text; the
broker compiles it once and evaluates it against each message's properties (TAGS, KEYS and
the user's own). The quirks are kept on purpose, so a consumer gets the same messages from
idemp as from RocketMQ:

* property values are strings. Against a number they are parsed the way Java parses them
  for that number's type: ``a > 5`` reads ``a`` as an int, so ``'10.5'`` cannot be read and
  the message is dropped, while ``a > 5.0`` reads it as a double;
* a missing property is NULL, and NULL spreads through comparisons, NOT, AND and OR
  (three-valued logic). Only a TRUE result delivers the message;
* an error while evaluating (e.g. ``'abc'`` against a number) drops the message.

One deliberate difference: RocketMQ's parser stops after the first complete expression and
ignores what follows, so ``a = 0x10`` selects on ``a = 0``. Here anything left over is an
error.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, NoReturn

__all__ = ["Selector", "SelectorError", "compile_selector"]

_Fn = Callable[[Mapping[str, str]], Any]

_MAX_DEPTH = 100  # nesting of parentheses and prefix operators; keeps clear of RecursionError


class SelectorError(ValueError):
    """A selector RocketMQ refuses to compile (its broker answers SUBSCRIPTION_PARSE_FAILED).

    ``position`` is the 0-based offset in the text where the problem was found.
    """

    def __init__(self, problem: str, text: str, position: int) -> None:
        self.position = position
        super().__init__(f"invalid SQL92 selector at {_where(text, position)}: {problem}")


class Selector:
    """A compiled selector: compile once per subscription, then match every message."""

    __slots__ = ("text", "_evaluate")

    def __init__(self, text: str, evaluate: _Fn) -> None:
        self.text = text
        self._evaluate = evaluate

    def matches(self, properties: Mapping[str, str]) -> bool:
        """True only when the selector is TRUE for these properties.

        FALSE, NULL (unknown) and an evaluation error all mean "not delivered", as in
        RocketMQ's ExpressionMessageFilter.
        """
        try:
            return self._evaluate(properties) is True
        except Exception:  # RocketMQ catches Throwable, logs it and filters the message out
            return False

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """Parse and check ``text`` once; raises SelectorError where RocketMQ would refuse it."""
    return Selector(text, _Parser(text).parse().fn)


def _where(text: str, pos: int) -> str:
    if "\n" not in text:
        return f"column {pos + 1}"
    line = text.count("\n", 0, pos) + 1
    column = pos - text.rfind("\n", 0, pos)
    return f"line {line}, column {column}"


# ---------------------------------------------------------------------------------------
# Java values. A property is a str; literals are Integer (int), Long (_Long), Double (float),
# Boolean (bool) or String (str); None is Java's null.


class _Long(int):
    """A Java Long: a plain int stands for an Integer, and strings are parsed per type."""

    __slots__ = ()


class _EvalError(Exception):
    """What Java throws while evaluating (NumberFormatException, ClassCastException)."""


_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_JAVA_TRIM = "".join(map(chr, range(0x21)))  # String.trim(): every char <= U+0020
_INTEGER_RE = re.compile(r"([+-]?)(\d+)")  # Character.digit(c, 10): any Unicode digit
_DOUBLE_RE = re.compile(
    r"([+-]?)(?:(NaN|Infinity)"
    r"|(0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?"
    r"|((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?)"
)


def _java_integer(s: str, long: bool) -> int:
    """Integer.valueOf / Long.valueOf."""
    m = _INTEGER_RE.fullmatch(s)
    if m is None:
        raise _EvalError(f"For input string: {s!r}")
    digits = m.group(2)
    if not digits.isascii():
        if max(digits) > "\uffff":  # Java sees two surrogate halves, neither a digit
            raise _EvalError(f"For input string: {s!r}")
        digits = "".join(str(unicodedata.decimal(c)) for c in digits)
    digits = digits.lstrip("0") or "0"
    value = int(digits) if len(digits) <= 19 else 2**64
    if m.group(1) == "-":
        value = -value
    lo, hi = _INT64 if long else _INT32
    if not lo <= value <= hi:
        raise _EvalError(f"For input string: {s!r}")
    return value


def _java_double(s: str) -> float:
    """Double.valueOf: trimmed; NaN, Infinity, hex and a trailing f/d suffix accepted."""
    m = _DOUBLE_RE.fullmatch(s.strip(_JAVA_TRIM))
    if m is None:
        raise _EvalError(f"For input string: {s!r}")
    sign, special, hexa, decimal = m.groups()
    if special == "NaN":
        return math.nan
    value = math.inf if special else float.fromhex(hexa) if hexa else float(decimal)
    return -value if sign == "-" else value


def _double_cmp(a: float, b: float) -> int:
    """Double.compareTo: NaN above everything (and equal to itself), -0.0 below 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan, b_nan = a != a, b != b
    if a_nan or b_nan:
        return a_nan - b_nan
    return (math.copysign(1.0, a) > 0) - (math.copysign(1.0, b) > 0)


def _compare(lv: Any, rv: Any) -> int:
    """ComparisonExpression.__compare with string conversion on (as the parser always sets).

    Mixed types are brought together as Java does; a pair it cannot bring together compares
    as -1, and a string that does not parse is an error.
    """
    lc, rc = type(lv), type(rv)
    if lc is not rc:
        if lc is bool:
            if rc is str:  # Java casts the Boolean itself to String here
                raise _EvalError("ClassCastException: Boolean cannot be cast to String")
            return -1
        if lc is int or lc is _Long:
            if rc is float:
                lv = float(lv)
            elif rc is str:
                rv = _java_integer(rv, lc is _Long)
            elif rc is not int and rc is not _Long:
                return -1
        elif lc is float:
            if rc is int or rc is _Long:
                rv = float(rv)
            elif rc is str:
                rv = _java_double(rv)
            else:
                return -1
        elif lc is str:
            if rc is bool:
                lv = lv.isascii() and lv.lower() == "true"  # Boolean.valueOf
            elif rc is float:
                lv = _java_double(lv)
            elif rc is int or rc is _Long:
                lv = _java_integer(lv, rc is _Long)
            else:
                return -1
        else:
            return -1
    if type(lv) is float:
        return _double_cmp(lv, rv)
    return (lv > rv) - (lv < rv)


# ---------------------------------------------------------------------------------------
# Tokens (JavaCC longest match; keywords win over identifiers of the same length).

_KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})
_OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "(", ")", ",", "+", "-")
_ID_RE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_DECIMAL_RE = re.compile(r"0|[1-9][0-9]*[lL]?")
_FLOAT_RE = re.compile(
    r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+"
)
_DOUBLE_MIN = 5e-324  # Double.MIN_VALUE, the smallest positive double


class _Tok(NamedTuple):
    kind: str  # "ID", "STR", "DEC", "FLOAT", "EOF", a keyword or an operator
    value: str  # decoded string, identifier or literal text
    pos: int
    end: int


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\n\r\f":
            i += 1
            continue
        if text.startswith("--", i):
            eol = [j for j in (text.find("\n", i), text.find("\r", i)) if j >= 0]
            if eol:
                i = min(eol) + 1
                continue
            # with no line end it is no comment: JavaCC reads two minus signs
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise SelectorError("unterminated /* comment", text, i)
            i = j + 2
            continue
        if c == "'":
            chars: list[str] = []
            j = i + 1
            while True:
                if j >= n:
                    raise SelectorError("unterminated string literal", text, i)
                if text[j] == "'":
                    if text.startswith("''", j):
                        chars.append("'")
                        j += 2
                        continue
                    break
                chars.append(text[j])
                j += 1
            toks.append(_Tok("STR", "".join(chars), i, j + 1))
            i = j + 1
            continue
        if "0" <= c <= "9" or c == ".":
            dec, flo = _DECIMAL_RE.match(text, i), _FLOAT_RE.match(text, i)
            m = flo if flo and (dec is None or flo.end() > dec.end()) else dec
            if m is not None:
                toks.append(_Tok("FLOAT" if m is flo else "DEC", m.group(), i, m.end()))
                i = m.end()
                continue
        m = _ID_RE.match(text, i)
        if m is not None:
            word = m.group()
            kind = word.upper() if word.upper() in _KEYWORDS else "ID"
            toks.append(_Tok(kind, word, i, m.end()))
            i = m.end()
            continue
        for op in _OPERATORS:
            if text.startswith(op, i):
                toks.append(_Tok(op, op, i, i + len(op)))
                i += len(op)
                break
        else:
            raise SelectorError(f"unexpected character {c!r}", text, i)
    toks.append(_Tok("EOF", "", n, n))
    return toks


# ---------------------------------------------------------------------------------------
# Nodes. ``kind`` is what RocketMQ's checks look at: a property, a literal (CONST), a
# TRUE/FALSE/NULL literal (BCONST, which is also a condition), any other condition (BOOL),
# or a negation (OTHER).

_PROP, _CONST, _BCONST, _BOOL, _OTHER = "property", "literal", "boolean literal", "bool", "-"


class _Node:
    __slots__ = ("kind", "fn", "start", "end", "value", "folded", "logic", "parts")

    def __init__(self, kind: str, fn: _Fn, start: int, end: int) -> None:
        self.kind = kind
        self.fn = fn
        self.start = start
        self.end = end
        self.value: Any = None  # literal's value, or the property's name
        self.folded = False  # value is known without a message
        self.logic = ""  # "AND" / "OR": parts holds the flattened operands
        self.parts: tuple[_Node, ...] = ()


def _constant(kind: str, value: Any, start: int, end: int) -> _Node:
    node = _Node(kind, lambda _p: value, start, end)
    node.value = value
    node.folded = True
    return node


def _negate_value(v: Any) -> Any:
    t = type(v)
    if t is int or t is float:
        return -v
    if t is _Long:
        return _Long(-v)
    return None  # UnaryExpression: only a Number is negated, anything else gives null


def _ordering(accept: Callable[[int], bool], lf: _Fn, rf: _Fn) -> _Fn:
    def fn(p: Mapping[str, str]) -> Any:
        lv = lf(p)
        if lv is None:
            return None
        rv = rf(p)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:  # two strings are ordered as doubles
            return accept(_double_cmp(_java_double(lv), _java_double(rv)))
        return accept(_compare(lv, rv))

    return fn


def _equality(lf: _Fn, rf: _Fn) -> _Fn:
    def fn(p: Mapping[str, str]) -> Any:
        lv = lf(p)
        rv = rf(p)
        if lv is None:  # null = null is TRUE, null = x is unknown ...
            return True if rv is None else None
        if rv is None:  # ... but x = null is FALSE (RocketMQ's asymmetry)
            return False
        return _compare(lv, rv) == 0

    return fn


def _not(f: _Fn) -> _Fn:
    def fn(p: Mapping[str, str]) -> Any:
        v = f(p)
        return None if v is None else not v

    return fn


def _is_null(f: _Fn, negated: bool) -> _Fn:
    """IS NULL is an equality with NULL, so it is never unknown."""
    if negated:
        return lambda p: f(p) is not None
    return lambda p: f(p) is None


def _connective(fns: tuple[_Fn, ...], decisive: bool) -> _Fn:
    """AND (decisive FALSE) and OR (decisive TRUE): left to right, stopping at the
    decisive value; otherwise unknown if any was unknown, else the other value."""

    def fn(p: Mapping[str, str]) -> Any:
        unknown = False
        for f in fns:
            v = f(p)
            if v is None:
                unknown = True
            elif bool(v) is decisive:
                return decisive
        return None if unknown else not decisive

    return fn


_ORDERINGS: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}


class _Parser:
    """Recursive descent over SelectorParser.jj's grammar, with its construction checks."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.depth = -1  # a bare operand is depth 0; each parenthesis or prefix adds one

    # -- tokens ----------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> _Tok:
        return self.toks[min(self.i + ahead, len(self.toks) - 1)]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        if tok.kind != "EOF":
            self.i += 1
        return tok

    def fail(self, problem: str, pos: int) -> NoReturn:
        raise SelectorError(problem, self.text, pos)

    def found(self, tok: _Tok) -> str:
        return "end of selector" if tok.kind == "EOF" else repr(self.text[tok.pos : tok.end])

    def expect(self, kind: str, what: str) -> _Tok:
        tok = self.peek()
        if tok.kind != kind:
            self.fail(f"expected {what}, found {self.found(tok)}", tok.pos)
        return self.take()

    def src(self, node: _Node) -> str:
        return repr(self.text[node.start : node.end])

    # -- grammar ---------------------------------------------------------------------

    def parse(self) -> _Node:
        node = self.or_expr()
        tok = self.peek()
        if tok.kind != "EOF":
            problem = f"unexpected {self.found(tok)} after a complete expression"
            prev = self.toks[self.i - 1]
            radix = tok.kind == "DEC" or (tok.kind == "ID" and tok.value[0] in "xX")
            if prev.value == "0" and tok.pos == prev.end and radix:
                problem += " (RocketMQ 4.9.7 has no hex or octal literals)"
            self.fail(problem, tok.pos)
        return self.as_bool(node)

    def or_expr(self) -> _Node:
        return self.chain("OR", self.and_expr)

    def and_expr(self) -> _Node:
        return self.chain("AND", self.equality)

    def chain(self, op: str, operand: Callable[[], _Node]) -> _Node:
        """``operand (op operand)*``, left-associative."""
        left = operand()
        while self.peek().kind == op:
            self.take()
            right = operand()
            left = self.logic(op, self.as_bool(left), self.as_bool(right))
        return left

    def equality(self) -> _Node:
        left = self.comparison()
        while True:
            tok = self.peek()
            if tok.kind in ("=", "<>"):
                self.take()
                right = self.comparison()
                left = self.equal(left, right, tok)
                if tok.kind == "<>":
                    left = self.boolean(_not(left.fn), left.start, left.end)
            elif tok.kind == "IS":
                self.take()
                negated = self.peek().kind == "NOT"
                if negated:
                    self.take()
                end = self.expect("NULL", "NULL after IS NOT" if negated else "NULL or NOT NULL")
                fn = _is_null(left.fn, negated)
                left = self.boolean(fn, left.start, end.end)
            else:
                return left

    def comparison(self) -> _Node:
        left = self.unary()
        while True:
            tok = self.peek()
            if tok.kind in _ORDERINGS:
                self.take()
                left = self.ordering(tok.kind, left, self.unary())
            elif tok.kind == "BETWEEN":
                self.take()
                left = self.between(left, negated=False)
            elif tok.kind == "IN":
                self.take()
                left = self.in_list(left, negated=False)
            elif tok.kind == "NOT":
                after = self.peek(1)
                if after.kind not in ("BETWEEN", "IN"):
                    found = self.found(after)
                    self.fail(f"expected BETWEEN or IN after NOT, found {found}", after.pos)
                self.take()
                self.take()
                if after.kind == "BETWEEN":
                    left = self.between(left, negated=True)
                else:
                    left = self.in_list(left, negated=True)
            else:
                return left

    def unary(self) -> _Node:
        tok = self.peek()
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            self.fail(f"nested more than {_MAX_DEPTH} levels deep", tok.pos)
        try:
            if tok.kind == "+":
                self.take()
                return self.unary()
            if tok.kind == "-":
                self.take()
                return self.negate(self.unary(), tok)
            if tok.kind == "NOT":
                self.take()
                inner = self.as_bool(self.unary())
                return self.boolean(_not(inner.fn), tok.pos, inner.end)
            return self.primary()
        finally:
            self.depth -= 1

    def primary(self) -> _Node:
        tok = self.take()
        kind = tok.kind
        if kind == "STR":
            return _constant(_CONST, tok.value, tok.pos, tok.end)
        if kind == "DEC":
            return _constant(_CONST, self.decimal(tok), tok.pos, tok.end)
        if kind == "FLOAT":
            return _constant(_CONST, self.floating(tok), tok.pos, tok.end)
        if kind in ("TRUE", "FALSE", "NULL"):
            value = {"TRUE": True, "FALSE": False, "NULL": None}[kind]
            return _constant(_BCONST, value, tok.pos, tok.end)
        if kind == "ID":
            name = tok.value
            node = _Node(_PROP, lambda p: p.get(name), tok.pos, tok.end)
            node.value = name
            return node
        if kind == "(":
            inner = self.or_expr()
            self.expect(")", "')'")
            return inner  # RocketMQ keeps no node for parentheses
        self.fail(f"expected a value, found {self.found(tok)}", tok.pos)

    # -- literals --------------------------------------------------------------------

    def decimal(self, tok: _Tok) -> int:
        """ConstantExpression.createFromDecimal: a Long, narrowed to Integer when it fits."""
        digits = tok.value.rstrip("lL")
        value = int(digits) if len(digits) <= 19 else 2**64
        if value > _INT64[1]:
            self.fail(f"integer {tok.value} is out of range (at most {_INT64[1]})", tok.pos)
        return value if value <= _INT32[1] else _Long(value)

    def floating(self, tok: _Tok) -> float:
        """ConstantExpression.createFloat: a Double, refusing infinity and anything below
        Double.MIN_VALUE, which includes 0.0 itself."""
        value = float(tok.value)
        if value == math.inf:
            self.fail(f"number {tok.value} is too large for a double", tok.pos)
        if value < _DOUBLE_MIN:
            self.fail(
                f"number {tok.value} is below 4.9E-324, which RocketMQ refuses (write 0 for zero)",
                tok.pos,
            )
        return value

    # -- construction, with ComparisonExpression's and the parser's checks ------------

    def boolean(self, fn: _Fn, start: int, end: int) -> _Node:
        return _Node(_BOOL, fn, start, end)

    def as_bool(self, node: _Node) -> _Node:
        """asBooleanExpression: conditions pass, a property is cast, anything else fails."""
        if node.kind in (_BOOL, _BCONST):
            return node
        if node.kind == _PROP:
            name = node.value

            def cast(p: Mapping[str, str]) -> Any:
                # a value that is not a Boolean casts to FALSE, and every property is a str
                return None if p.get(name) is None else False

            return self.boolean(cast, node.start, node.end)
        self.fail(f"{self.src(node)} is not a condition", node.start)

    def logic(self, op: str, left: _Node, right: _Node) -> _Node:
        parts = (left.parts if left.logic == op else (left,)) + (
            right.parts if right.logic == op else (right,)
        )
        fns = tuple(part.fn for part in parts)
        node = self.boolean(_connective(fns, decisive=op == "OR"), left.start, right.end)
        node.logic = op
        node.parts = parts
        return node

    def orderable(self, node: _Node, op: str) -> None:
        """checkLessThanOperand: only numbers, properties and negations can be ordered."""
        if node.kind in (_PROP, _OTHER):
            return
        if node.kind == _CONST and type(node.value) in (int, _Long, float):
            return
        self.fail(f"{op} needs numbers or properties, not {self.src(node)}", node.start)

    def ordering(self, op: str, left: _Node, right: _Node) -> _Node:
        self.orderable(left, op)
        self.orderable(right, op)
        return self.boolean(_ordering(_ORDERINGS[op], left.fn, right.fn), left.start, right.end)

    def equal(self, left: _Node, right: _Node, tok: _Tok) -> _Node:
        for node in (left, right):  # checkEqualOperand
            if node.kind == _BCONST and node.value is None:
                self.fail(f"{tok.kind} cannot compare with NULL; use IS [NOT] NULL", node.start)
        # checkEqualOperandCompatability: only TRUE/FALSE on the left of a literal is refused
        if left.kind == _BCONST and right.kind == _CONST:
            self.fail(f"{self.src(left)} cannot be compared with {self.src(right)}", left.start)
        return self.boolean(_equality(left.fn, right.fn), left.start, right.end)

    def between(self, value: _Node, negated: bool) -> _Node:
        low = self.unary()
        self.expect("AND", "AND between the bounds of BETWEEN")
        high = self.unary()
        if not negated and low.kind in (_CONST, _BCONST) and high.kind in (_CONST, _BCONST):
            if low.value is None or high.value is None:
                self.fail("BETWEEN's bounds cannot be NULL", low.start)
            # Other non-numbers fail below, as they cannot be ordered.
            numbers = (int, _Long, float)
            if (
                type(low.value) in numbers
                and type(high.value) in numbers
                and _compare(high.value, low.value) < 0
            ):
                self.fail(
                    f"BETWEEN's lower bound {self.src(low)} is above its upper bound"
                    f" {self.src(high)}",
                    low.start,
                )
        if negated:  # value < low OR value > high
            return self.logic("OR", self.ordering("<", value, low), self.ordering(">", value, high))
        return self.logic("AND", self.ordering(">=", value, low), self.ordering("<=", value, high))

    def in_list(self, left: _Node, negated: bool) -> _Node:
        self.expect("(", "'(' after IN")
        items = [self.expect("STR", "a string literal in the IN list").value]
        while self.peek().kind == ",":
            self.take()
            items.append(self.expect("STR", "a string literal in the IN list").value)
        end = self.expect(")", "',' or ')' in the IN list")
        if left.kind != _PROP:
            self.fail(f"IN needs a property on its left, not {self.src(left)}", left.start)
        name, members = left.value, frozenset(items)

        def fn(p: Mapping[str, str]) -> Any:
            v = p.get(name)
            if v is None or type(v) is not str:
                return None
            return (v in members) is not negated

        return self.boolean(fn, left.start, end.end)

    def negate(self, inner: _Node, tok: _Tok) -> _Node:
        if inner.folded:
            return _constant(_OTHER, _negate_value(inner.value), tok.pos, inner.end)
        f = inner.fn
        return _Node(_OTHER, lambda p: _negate_value(f(p)), tok.pos, inner.end)
