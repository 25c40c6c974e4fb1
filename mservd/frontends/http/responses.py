"""Writing WSGI responses: the one place status lines, JSON errors and headers are made."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any, Callable, Iterable

from mservd.errors import MservdError, error_body

_STATUS_LINES: dict[int, str] = {}


def status_line(code: int) -> str:
    line = _STATUS_LINES.get(code)
    if line is None:
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "Unknown"
        line = _STATUS_LINES[code] = f"{code} {phrase}"
    return line


def respond(start_response: Callable, status: int, body: bytes, content_type: str,
            headers: Iterable[tuple[str, str]] = ()) -> list[bytes]:
    out = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
    out.extend(headers)
    start_response(status_line(status), out)
    return [body]


def respond_json(start_response: Callable, status: int, doc: Any,
                 headers: Iterable[tuple[str, str]] = ()) -> list[bytes]:
    return respond(start_response, status, json.dumps(doc, indent=2).encode(), "application/json",
                   headers)


def respond_error(start_response: Callable, exc: MservdError,
                  headers: Iterable[tuple[str, str]] = ()) -> list[bytes]:
    extra = list(headers) + list(exc.headers.items())
    if exc.http_status == 401:
        extra.append(("WWW-Authenticate", "Bearer"))
    return respond(start_response, exc.http_status, exc.to_body(), "application/json", extra)


def error_response(status: int, type_: str, message: str) -> bytes:
    return error_body(status, type_, message)
