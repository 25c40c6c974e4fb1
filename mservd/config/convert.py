"""Turning raw setting values into typed ones: each converter takes a string (from a file or
the environment) or an already typed value and returns it typed, or raises ``ValueError`` whose
message completes the line ``<key>: <message>``; every problem goes into one :class:`ConfigError`."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import types
import typing
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mservd.errors import short_repr

logger = logging.getLogger(__name__)


class ConfigError(Exception):
    """Settings that cannot be used, every bad key listed at once.

    :param problems: one line per bad key, each naming the key (and where it came from when that
        is not ``config.properties``), the value and what is valid.
    :param title: the first line of the message.
    """

    def __init__(self, problems: Sequence[str], *, title: str = "Invalid configuration") -> None:
        self.problems: list[str] = list(problems)
        self.title = title
        super().__init__(f"{title}:\n" + "\n".join(f"  {p}" for p in self.problems))


# --- value conversion ---------------------------------------------------------------------
# A converter takes a raw value (a string from a file or the environment, or an already typed
# value from the command line or JSON/YAML) and returns the typed value, or raises ValueError
# whose message completes the line "<key>: <message>".

Convert = Callable[[Any], Any]


INT_LIMIT = 2**53  # no count, size or duration here means more; a clock plus it stays a float


def to_int(value: Any) -> int:
    """An integer setting or parameter: an int, or its decimal digits (a sign allowed)."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        digits = value.strip()
        number = int(digits) if len(digits) <= 20 else INT_LIMIT + 1
    if number is None:
        raise ValueError(f"{short_repr(value)} is not an integer")
    if abs(number) > INT_LIMIT:
        raise ValueError(f"an integer of at most {INT_LIMIT} is needed; this one is larger")
    return number


_DIGITS = re.compile(r"[+-]?[0-9]+")


def _to_float(value: Any) -> float:
    result: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value) if abs(value) <= INT_LIMIT else None
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            pass
    if result is None or not math.isfinite(result):
        raise ValueError(f"{short_repr(value)} is not a number")
    return result


def to_bool(value: Any) -> bool:
    """A boolean setting or parameter, one spelling everywhere: true or false, any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{short_repr(value)} is not a boolean (use true or false)")


def _to_str(value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        return value.strip()
    raise ValueError(f"{short_repr(value)} is not a string")


def _to_str_tuple(value: Any) -> tuple[str, ...]:
    """A comma-separated list (TorchServe's list syntax) or a sequence of strings."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ValueError(f"{short_repr(value)} is not a comma-separated list")
    return tuple(item.strip() for item in items if item.strip())


def to_json_object(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON: {exc}") from None
    if isinstance(value, Mapping):
        return dict(value)
    raise ValueError(f"must be a JSON object, got {type(value).__name__}")


def _optional(convert: Convert) -> Convert:
    """An empty value means "not set" (``number_of_gpu=`` leaves GPU detection on)."""

    def optional(value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return convert(value)

    return optional


def converter_for(hint: Any) -> Convert:
    """The converter for a Settings field's declared type; parsing follows the type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _optional(converter_for(inner))
    if hint is bool:
        return to_bool
    if hint is int:
        return to_int
    if hint is float:
        return _to_float
    if hint is str:
        return _to_str
    if origin is tuple:
        return _to_str_tuple
    if origin in (dict, Mapping) or hint is dict:
        return to_json_object
    raise TypeError(f"no converter for settings type {hint!r}")


# --- checks on converted values -------------------------------------------------------------
# A check takes the converted value and returns it (possibly normalised) or raises ValueError.


def at_least(minimum: float) -> Convert:
    def at_least(value: Any) -> Any:
        if value is not None and value < minimum:
            raise ValueError(f"{short_repr(value)} must be >= {minimum}")
        return value

    return at_least


def above(minimum: float) -> Convert:
    def above(value: Any) -> Any:
        if value is not None and value <= minimum:
            raise ValueError(f"{short_repr(value)} must be > {minimum}")
        return value

    return above


def between(low: float, high: float) -> Convert:
    def between(value: Any) -> Any:
        if value is not None and not low <= value <= high:
            raise ValueError(f"{short_repr(value)} must be from {low} to {high}")
        return value

    return between


def valid_port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise ValueError(f"{short_repr(value)} is not a port (0-65535; 0 picks a free port)")
    return value


def one_of(*choices: str, upper: bool = False) -> Convert:
    def one_of(value: str) -> str:
        normal = value.upper() if upper else value.lower()
        if normal not in choices:
            raise ValueError(f"{short_repr(value)} is not one of {', '.join(choices)}")
        return normal

    return one_of


def parse_address(address: str) -> tuple[str, str, int]:
    """Split an ``http(s)://host:port`` address into ``(scheme, host, port)``.

    The frontends bind what this returns; port 0 asks the OS for a free port. IPv6 hosts are
    written in brackets (``http://[::1]:8080``) and returned without them.

    :raises ValueError: the address is not ``http(s)://host:port``; the message says so.
    """
    bad = ValueError(f"{address!r} is not an http(s)://host:port address (port 0-65535)")
    try:
        parts = urllib.parse.urlsplit(address)
        port = parts.port
    except ValueError:
        raise bad from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or port is None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise bad
    return parts.scheme, parts.hostname, port


def valid_address(value: str) -> str:
    parse_address(value)
    return value


def valid_regex_list(value: tuple[str, ...]) -> tuple[str, ...]:
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
    return value


def valid_regex(value: str) -> str:
    valid_regex_list((value,))
    return value


class Problems(ValueError):
    """Several problems in one value (the ``models=`` block), reported one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def chain(*steps: Convert) -> Convert:
    def chained(value: Any) -> Any:
        for step in steps:
            value = step(value)
        return value

    return chained


def meta(key: str, doc: str, check: Convert | None = None) -> dict[str, Any]:
    return {"key": key, "doc": doc, "check": check}
