"""The display-filter language of ``iwarp dissect -Y``: parsed once, evaluated per JSON record.

A filter is a predicate over the record of :func:`stack.dissect.fields.record_json`.  The
language is small and safe (no ``eval``): ``and``/``or``/``not`` (``&&``, ``||``, ``!``),
parentheses, comparisons ``== != < <= > >=``, ``contains`` (substring, case-insensitive,
or list element) and ``in (a, b, ...)``, literals (decimal or ``0x`` integers, decimal
fractions, quoted strings, ``true``, ``false``, ``null``) and field names: the JSON keys
(:data:`stack.dissect.fields.FIELDS`), their Wireshark names and the derived fields
(``tcp.port``, ``ip.addr``, ``frame.time_relative``; :func:`~stack.dissect.fields.field_getter`;
an either-end field matches when one of its values does) plus any prefixes an
upper-layer decoder adds.  A
bare field is true when present and truthy; a missing field compares unequal to
everything but ``null``; ordering compares numbers with numbers and strings with
strings only (booleans never).  A filter that does not parse raises :class:`FilterError`.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

from stack.dissect.fields import FIELDS, AnyOf, FieldContext, field_getter
from stack.errors import IwarpError

__all__ = ["FilterError", "Predicate", "compile_filter"]


class FilterError(IwarpError):
    """A display filter that does not parse."""


MAX_FILTER_TOKENS = 256
"""Tokens a display filter may have."""
MAX_FILTER_DEPTH = 64
"""Nesting a display filter may have (parentheses and ``not``): the parser and the compiled
predicate recurse once per level, which stays far below Python's recursion limit; chained
``and``/``or`` terms are evaluated in a loop, not nested."""


_TOKEN = re.compile(
    r"""\s*(?:
        (?P<num>0[xX][0-9a-fA-F]+|\d+\.\d*|\d+)
      | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>==|!=|<=|>=|&&|\|\||[<>()!,])
      | (?P<word>[A-Za-z_][A-Za-z0-9_.\-]*)
    )""",
    re.VERBOSE,
)

_MISSING = object()
Predicate = Callable[[dict[str, Any]], Any]


def _tokenize(
    text: str, field_prefixes: tuple[str, ...] = (), context: FieldContext | None = None
) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise FilterError(f"unexpected character {text[pos:].strip()[:1]!r} at {pos}")
        pos = m.end()
        if m.group("num") is not None:
            num = m.group("num")
            tokens.append(("lit", float(num) if "." in num else int(num, 0)))
        elif m.group("str") is not None:
            raw = m.group("str")[1:-1]
            tokens.append(("lit", re.sub(r"\\(.)", r"\1", raw)))
        elif m.group("op") is not None:
            tokens.append(("op", m.group("op")))
        else:
            word = m.group("word")
            low = word.lower()
            if low in ("and", "or", "not", "contains", "in"):
                tokens.append(("op", low))
            elif low in ("true", "false"):
                tokens.append(("lit", low == "true"))
            elif low in ("null", "none"):
                tokens.append(("lit", None))
            elif word in FIELDS or word.startswith(field_prefixes or ("\0",)):
                tokens.append(("field", lambda r, key=word: r.get(key, _MISSING)))
            else:
                get = field_getter(word, context)
                if get is None:
                    raise FilterError(f"unknown field {word!r} (fields: -G fields; quote strings)")
                tokens.append(("field", get))
    return tokens


class _Parser:
    def __init__(self, tokens: list[tuple[str, Any]]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0

    def peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, Any]:
        tok = self.peek()
        if tok is None:
            raise FilterError("unexpected end of filter")
        self.i += 1
        return tok

    def accept(self, *ops: str) -> str | None:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] in ops:
            self.i += 1
            return tok[1]
        return None

    def parse(self) -> Predicate:
        pred = self.or_expr()
        if self.peek() is not None:
            raise FilterError(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return pred

    def or_expr(self) -> Predicate:
        terms = [self.and_expr()]
        while self.accept("or", "||"):
            terms.append(self.and_expr())
        if len(terms) == 1:
            return terms[0]
        return lambda r: any(term(r) for term in terms)

    def and_expr(self) -> Predicate:
        terms = [self.not_expr()]
        while self.accept("and", "&&"):
            terms.append(self.not_expr())
        if len(terms) == 1:
            return terms[0]
        return lambda r: all(term(r) for term in terms)

    def nested(self, parse: Callable[[], Predicate]) -> Predicate:
        """``parse()`` one nesting level down (:data:`MAX_FILTER_DEPTH`)."""
        if self.depth >= MAX_FILTER_DEPTH:
            raise FilterError(f"filter nested too deeply (at most {MAX_FILTER_DEPTH} levels)")
        self.depth += 1
        try:
            return parse()
        finally:
            self.depth -= 1

    def not_expr(self) -> Predicate:
        if self.accept("not", "!"):
            inner = self.nested(self.not_expr)
            return lambda r: not inner(r)
        return self.comparison()

    def operand(self) -> Callable[[dict[str, Any]], Any]:
        kind, value = self.take()
        if kind == "lit":
            return lambda r: value
        if kind == "field":
            return value  # a getter (see _tokenize)
        raise FilterError(f"expected a field or a value, got {value!r}")

    def comparison(self) -> Predicate:
        if self.accept("("):
            inner = self.nested(self.or_expr)
            if not self.accept(")"):
                raise FilterError("missing ')'")
            return inner
        left = self.operand()
        op = self.accept("==", "!=", "<", "<=", ">", ">=", "contains", "in")
        if op is None:
            return lambda r: _truthy(left(r))
        if op == "in":
            if not self.accept("("):
                raise FilterError("'in' needs a parenthesised list")
            options = []
            while True:
                kind, value = self.take()
                if kind != "lit":
                    raise FilterError("'in' lists hold values only")
                options.append(value)
                if self.accept(")"):
                    break
                if not self.accept(","):
                    raise FilterError("expected ',' or ')' in a list")
            return lambda r: _any(left(r), options, _member)
        right = self.operand()
        return _compare(op, left, right)


def _truthy(value: Any) -> bool:
    return value is not _MISSING and bool(value)


def _any(value: Any, other: Any, test: Callable[[Any, Any], bool]) -> bool:
    """``test(value, other)``, or for an either-end field (``tcp.port``) on any of its values."""
    if isinstance(value, AnyOf):
        return any(test(v, other) for v in value)
    return test(value, other)


def _equal(a: Any, b: Any) -> bool:
    if a is _MISSING:
        a = None
    if b is _MISSING:
        b = None
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b


def _member(a: Any, options: list[Any]) -> bool:
    return any(_equal(a, v) for v in options)


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _compare(op: str, left: Predicate, right: Predicate) -> Predicate:
    if op == "==":
        return lambda r: _any(left(r), right(r), _equal)
    if op == "!=":  # as Wireshark 4: no value of an either-end field equals the right side
        return lambda r: not _any(left(r), right(r), _equal)
    if op == "contains":

        def contains(a: Any, b: Any) -> bool:
            if isinstance(a, list):
                return b in a
            if isinstance(a, str) and isinstance(b, str):
                return b.lower() in a.lower()
            return False

        return lambda r: _any(left(r), right(r), contains)

    order = _ORDER[op]

    def ordered(a: Any, b: Any) -> bool:
        if isinstance(a, bool) or isinstance(b, bool):
            return False
        if not (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            or isinstance(a, str)
            and isinstance(b, str)
        ):
            return False
        return order(a, b)

    return lambda r: _any(left(r), right(r), ordered)


def compile_filter(
    text: str, field_prefixes: tuple[str, ...] = (), context: FieldContext | None = None
) -> Predicate:
    """Compile a display filter over JSON records; raises :class:`FilterError`.

    ``field_prefixes``: also accept fields starting with these (keys an upper-layer
    decoder adds to the records, e.g. ``kbtp_``); ``context``: what derived fields
    (``frame.time_relative``) need.
    """
    try:
        tokens = _tokenize(text, field_prefixes, context)
    except ValueError as exc:  # an integer literal past Python's digit limit
        raise FilterError(f"bad number: {exc}") from None
    if not tokens:
        raise FilterError("empty filter")
    if len(tokens) > MAX_FILTER_TOKENS:
        raise FilterError(f"filter too long: {len(tokens)} tokens (at most {MAX_FILTER_TOKENS})")
    return _Parser(tokens).parse()
