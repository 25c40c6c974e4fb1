"""The inference API's routes besides predictions, as a bare WSGI callable, and the helpers
that turn a prediction request into inputs.

The HTTP server (``server.py``) answers ``/predictions`` and ``/explanations``
itself, on its event loop, with :func:`parse_inputs`, :func:`forwarded_headers` and
:func:`request_timeout_ms` from here: the raw body, or one input per form field, forwarded to
the controller with the request's headers. The rest of the port — ``/ping``, KServe v1, the Open
Inference Protocol v2, the OpenAPI document — is :class:`InferenceApp`, which the server runs on
a thread with a blocking bridge.
"""

from __future__ import annotations

import io
import logging
from typing import Any, Callable

from mservd.errors import (
    BadRequest,
    MethodNotAllowed,
    MservdError,
    NoWorker,
    RequestTooLarge,
    ResourceNotFound,
)
from mservd.frontends.bridge import ControllerGone
from mservd.frontends.http.responses import respond, respond_error, respond_json

log = logging.getLogger(__name__)

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
_SKIPPED_HEADERS = frozenset({"authorization", "cookie"})


class InferenceApp:
    """``bridge`` is blocking: the HTTP server's ThreadBridge."""

    def __init__(self, bridge: Any, max_request_size: int, reply_timeout: float,
                 auth: bool) -> None:
        self.bridge = bridge
        self.max_request_size = max_request_size
        self.reply_timeout = reply_timeout
        self.auth = auth

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO") or "/"
        method = environ["REQUEST_METHOD"]
        try:
            if path.startswith("/v1/models"):
                from mservd.frontends.http import kserve_v1  # KServe's V1 protocol

                return kserve_v1.handle(self, environ, start_response, path)
            if path == "/v2" or path.startswith("/v2/"):
                from mservd.frontends.http import v2  # Open Inference Protocol v2 (docs/v2.md)

                return v2.handle(self, environ, start_response, path)
            if path == "/ping":
                if method != "GET":
                    raise MethodNotAllowed(f"Method {method} is not allowed on /ping; use GET.")
                reply = self.bridge.manage("ping", {}, None, 10.0)
                return respond(start_response, reply.status, reply.body, reply.content_type)
            if path in ("/", "/api-description"):  # OpenAPI 3; no token, as in TorchServe
                from mservd.frontends.http.openapi import inference_api

                wanted = "OPTIONS" if path == "/" else "GET"
                if method != wanted:
                    raise MethodNotAllowed(f"Method {method} is not allowed on {path}; use "
                                           f"{wanted}.")
                return respond_json(start_response, 200, inference_api())
            raise ResourceNotFound(f"Requested resource is not found: {method} {path}. "
                                   "Try POST /predictions/{model_name}.")
        except MservdError as exc:
            return respond_error(start_response, exc)
        except ControllerGone as exc:
            return respond_error(start_response, NoWorker(str(exc)))

    @staticmethod
    def forwarded_headers(environ: dict[str, Any]) -> dict[str, str]:
        return forwarded_headers(wsgi_headers(environ))

    def read_body(self, environ: dict[str, Any]) -> bytes:
        limit = self.max_request_size
        length = environ.get("CONTENT_LENGTH")
        stream = environ["wsgi.input"]
        if length:
            try:
                size = int(length)
            except ValueError:
                raise BadRequest(f"Invalid Content-Length {length!r}.") from None
            if size > limit:
                raise RequestTooLarge(f"Request body of {size} bytes exceeds max_request_size "
                                      f"({limit}).")
            return stream.read(size) if size else b""
        data = stream.read(limit + 1)
        if len(data) > limit:
            raise RequestTooLarge(f"Request body exceeds max_request_size ({limit}).")
        return data


def parse_inputs(content_type: str, body: bytes) -> tuple[list[tuple[str, str]], list[bytes]]:
    """A prediction's inputs: the raw body, or one input per field of a form."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in FORM_TYPES:
        return [("body", content_type)], [body]
    from werkzeug.formparser import parse_form_data

    env = {"wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)),
           "CONTENT_TYPE": content_type, "REQUEST_METHOD": "POST"}
    try:
        _, form, files = parse_form_data(env, silent=False)
    except Exception as exc:  # werkzeug raises several types for malformed forms
        raise BadRequest(f"Malformed {media} body: {exc}") from None
    inputs: list[tuple[str, str]] = []
    payloads: list[bytes] = []
    for name, value in form.items(multi=True):
        inputs.append((name, "text/plain; charset=utf-8"))
        payloads.append(value.encode("utf-8"))
    for name, storage in files.items(multi=True):
        inputs.append((name, storage.content_type or "application/octet-stream"))
        payloads.append(storage.read())
    if not inputs:
        raise BadRequest(f"The {media} body has no fields.")
    return inputs, payloads


def forwarded_headers(headers: dict[str, str]) -> dict[str, str]:
    """The request headers a handler sees (lower-case names), without credentials."""
    return {name: value for name, value in headers.items() if name not in _SKIPPED_HEADERS}


def wsgi_headers(environ: dict[str, Any]) -> dict[str, str]:
    """A WSGI environ's request headers, lower-case names, content-type included."""
    headers = {key[5:].replace("_", "-").lower(): value for key, value in environ.items()
               if key.startswith("HTTP_")}
    if environ.get("CONTENT_TYPE"):
        headers["content-type"] = environ["CONTENT_TYPE"]
    return headers


def request_timeout_ms(value: str | None) -> float | None:
    """The client's own queue deadline from ``X-Request-Timeout-Ms``, if it sent one."""
    if value is None:
        return None
    try:
        timeout = float(value)
    except ValueError:
        raise BadRequest(f"Invalid X-Request-Timeout-Ms {value!r}: give milliseconds, "
                         "e.g. 250.") from None
    if timeout < 0:
        raise BadRequest(f"Invalid X-Request-Timeout-Ms {value!r}: it must not be negative.")
    return timeout


__all__ = ["InferenceApp", "respond_json"]
