"""Java ``.properties`` files as TorchServe reads ``config.properties``: logical lines,
escapes, ``key=value`` or ``key: value``, and its ``$$NAME$$`` variables."""

from __future__ import annotations

import logging
import re
import types
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)


# --- config.properties ----------------------------------------------------------------------

_ESCAPES: Mapping[str, str] = types.MappingProxyType({"t": "\t", "n": "\n", "r": "\r", "f": "\f"})


def _logical_lines(text: str) -> list[str]:
    """Join continued lines the way java.util.Properties does.

    A line ending in an odd number of backslashes continues on the next, whose leading
    whitespace is dropped. Comment lines never continue, so a commented-out ``models=`` block
    needs ``#`` on every line. Unlike Java, whitespace after the backslash is forgiven: it is
    invisible in an editor and would silently cut a ``models=`` block short.
    """
    lines: list[str] = []
    current: str | None = None
    for raw in text.splitlines():
        line = (raw if current is None else raw.lstrip()).rstrip()
        if current is None:
            stripped = line.lstrip()
            if not stripped or stripped[0] in "#!":
                continue
            line = stripped
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            current = (current or "") + line[:-1]
            continue
        lines.append((current or "") + line)
        current = None
    if current is not None:
        lines.append(current)
    return lines


def _unescape(text: str) -> str:
    """Java properties escapes: ``\\t \\n \\r \\f \\uXXXX``, and ``\\x`` → ``x`` otherwise."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 >= len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
            out.append(chr(int(text[i + 2 : i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def parse_properties(text: str) -> dict[str, str]:
    """The keys and values of a config.properties text, in the subset TorchServe files use.

    ``key=value``, ``key: value`` and ``key value``; ``#`` and ``!`` comment lines; blank lines;
    a trailing backslash continues a value on the next line (how multi-line ``models=`` blocks
    are written); keys and values are trimmed; Java escapes are decoded as TorchServe's Java
    parser decodes them. A repeated key keeps its last value.
    """
    result: dict[str, str] = {}
    for line in _logical_lines(text):
        # The key ends at the first unescaped '=', ':' or whitespace (java.util.Properties).
        i = 0
        while i < len(line) and line[i] not in "=: \t\f":
            i += 2 if line[i] == "\\" else 1
        key = line[:i]
        rest = line[i:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:]
        result[_unescape(key)] = _unescape(rest.strip())
    return result


def read_properties(path: str, problems: list[str]) -> dict[str, str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        problems.append(f"config file {path!r} does not exist")
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"config file {path!r} cannot be read: {exc}")
        return {}
    return parse_properties(text)


_VARIABLE = re.compile(r"\$\$([^$]+[^$])\$\$")  # TorchServe's $$NAME$$ in a value


def with_variables(key: str, value: str, environ: Mapping[str, str],
                    problems: list[str]) -> str | None:
    """``value`` with each ``$$NAME$$`` replaced by the environment variable NAME, as
    TorchServe reads config.properties (a secret kept out of the file, a port from the
    platform); None, and a problem, when one is not set (TorchServe refuses to start too)."""
    if "$$" not in value:
        return value
    missing = [name for name in _VARIABLE.findall(value) if name not in environ]
    for name in missing:
        problems.append(f"{key}: the environment variable {name} (in $${name}$$) is not set")
    return None if missing else _VARIABLE.sub(lambda m: environ[m.group(1)], value)
