"""``iwarp dissect -T fields -e FIELD ...``: one row of chosen field values per PDU.

Field names are those of ``-G fields`` (:func:`stack.dissect.fields.field_getter`: the
JSON keys, their Wireshark names and the derived fields).  Values are printed as
tshark prints them: booleans as ``1``/``0``, a missing value as an empty column, lists
and either-end fields joined by the aggregator, STags as ``0x%08x`` and tagged offsets
as ``0x%016x`` (:data:`~stack.dissect.fields.HEX_DIGITS`, the strings of ``--json``),
``frame.time_relative`` in microseconds (six decimals).  ``-E`` options follow tshark's:
``header=y|n``, ``separator=/t|/s|CHAR``, ``quote=d|s|n``, ``aggregator=/s|CHAR``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from stack.dissect.fields import ALIASES, HEX_DIGITS, FieldContext, field_getter, hex_text
from stack.errors import IwarpError

__all__ = ["FieldsError", "FieldsFormat"]

_SPECIAL = {"/t": "\t", "/s": " "}
_QUOTES = {"d": '"', "s": "'", "n": ""}


class FieldsError(IwarpError):
    """An unknown ``-e`` field or a malformed ``-E`` option."""


def _render(value: Any, digits: int | None, key: str, aggregator: str) -> str:
    """One column: ``digits`` is the hex width of the field (None: not a hex field)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value) if digits is None else hex_text(value, digits)
    if isinstance(value, float):
        return f"{value:.6f}" if key == "frame.time_relative" else repr(value)
    if isinstance(value, list | tuple):
        return aggregator.join(_render(v, digits, key, aggregator) for v in value)
    return str(value)


class FieldsFormat:
    """The rows of ``-T fields``: ``header()`` (the names) and ``row(record)``.

    ``hex_digits``: the fields printed in hex and their widths (default
    :data:`~stack.dissect.fields.HEX_DIGITS`; an upper-layer decoder adds its own).
    """

    def __init__(
        self,
        names: Iterable[str],
        options: Iterable[str] = (),
        context: FieldContext | None = None,
        field_prefixes: tuple[str, ...] = (),
        hex_digits: dict[str, int] | None = None,
    ) -> None:
        self.names = list(names)
        if not self.names:
            raise FieldsError("-T fields needs at least one -e FIELD")
        self.show_header = False
        self.separator = "\t"
        self.quote = ""
        self.aggregator = ","
        for option in options:
            self._option(option)
        widths = HEX_DIGITS if hex_digits is None else hex_digits
        getters: list[tuple[str, int | None, Callable[[dict[str, Any]], Any]]] = []
        for name in self.names:
            get = field_getter(name, context)
            if get is None and field_prefixes and name.startswith(field_prefixes):
                get = (lambda key: lambda r: r.get(key))(name)
            if get is None:
                raise FieldsError(f"unknown field {name!r} for -e (list: -G fields)")
            json_key = ALIASES.get(name, name)
            getters.append((json_key, widths.get(json_key), get))
        self._getters = getters

    def _option(self, option: str) -> None:
        key, sep, value = option.partition("=")
        if not sep:
            raise FieldsError(f"-E wants NAME=VALUE, got {option!r}")
        if key == "header":
            if value not in ("y", "n"):
                raise FieldsError(f"-E header= wants y or n, got {value!r}")
            self.show_header = value == "y"
        elif key == "separator":
            self.separator = _SPECIAL.get(value, value)
            if len(self.separator) != 1:
                raise FieldsError(f"-E separator= wants /t, /s or one character, got {value!r}")
        elif key == "quote":
            if value not in _QUOTES:
                raise FieldsError(f"-E quote= wants d, s or n, got {value!r}")
            self.quote = _QUOTES[value]
        elif key == "aggregator":
            self.aggregator = _SPECIAL.get(value, value)
            if not self.aggregator:
                raise FieldsError("-E aggregator= wants /s or a character")
        else:
            raise FieldsError(f"unknown -E option {key!r} (header, separator, quote, aggregator)")

    def header(self) -> str:
        return self.separator.join(self._quoted(name) for name in self.names)

    def _quoted(self, text: str) -> str:
        q = self.quote
        return f"{q}{text}{q}" if q and text else text

    def row(self, record: dict[str, Any]) -> str:
        agg = self.aggregator
        return self.separator.join(
            self._quoted(_render(get(record), digits, key, agg))
            for key, digits, get in self._getters
        )
