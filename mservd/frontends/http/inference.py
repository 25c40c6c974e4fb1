"""The inference API as a bare WSGI callable: the hot path, so no framework in the way.

``POST /predictions/{model}[/{version}]`` is parsed here into inputs (the raw body, or one input
per form field), forwarded to the controller with the request's headers, and answered with the
bytes, status and headers the worker produced. ``/ping`` asks the controller for health.
"""

from __future__ import annotations

import io
import logging
import uuid
from typing import Any, Callable

from mservd import protocol
from mservd.errors import (
    BadRequest,
    MethodNotAllowed,
    MservdError,
    NoWorker,
    RequestTooLarge,
    ResourceNotFound,
)
from mservd.frontends.bridge import Bridge, ClientGone, ControllerGone, bearer_token
from mservd.frontends.http.responses import respond, respond_error, respond_json, status_line

log = logging.getLogger(__name__)

FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
_SKIPPED_HEADERS = frozenset({"authorization", "cookie"})


class InferenceApp:
    def __init__(self, bridge: Bridge, max_request_size: int, reply_timeout: float,
                 auth: bool) -> None:
        self.bridge = bridge
        self.max_request_size = max_request_size
        self.reply_timeout = reply_timeout
        self.auth = auth

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO") or "/"
        method = environ["REQUEST_METHOD"]
        try:
            if path.startswith("/predictions/") or path.startswith("/explanations/"):
                if method not in ("POST", "PUT"):
                    raise MethodNotAllowed(f"Method {method} is not allowed on {path}; use POST.")
                return self.predict(environ, start_response, path)
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

    def predict(self, environ: dict[str, Any], start_response: Callable, path: str) -> list[bytes]:
        parts = path.split("/")
        if len(parts) not in (3, 4) or not parts[2]:
            raise ResourceNotFound(f"Requested resource is not found: {path}. "
                                   "Use /predictions/{model_name}[/{version}].")
        model = parts[2]
        version = parts[3] if len(parts) == 4 and parts[3] else None
        body = self.read_body(environ)
        inputs, payloads = self.parse_inputs(environ, body)
        headers = self.forwarded_headers(environ)
        if parts[1] == "explanations":
            headers["explain"] = "True"
        rid_text = str(uuid.uuid4())
        rid = rid_text.encode()
        route = protocol.Route(rid, model, version, bearer_token(environ) if self.auth else None,
                               protocol.API_INFERENCE, request_timeout_ms(environ))
        frames = protocol.predict_frames(
            route, protocol.pack_meta(inputs, headers, parts[1] == "explanations"), payloads)
        try:
            reply = self.bridge.call(rid, frames, self.reply_timeout,
                                     client=environ.get("gunicorn.socket"), stream=True)
        except ClientGone:
            log.info("client went away before request %s was answered", rid_text)
            start_response(status_line(499), [("Content-Length", "0")])
            return [b""]
        if reply.stream is not None:
            return self.respond_streamed(start_response, reply, rid_text)
        out = [("Content-Type", reply.content_type), ("Content-Length", str(len(reply.body))),
               ("x-request-id", rid_text)]
        if reply.headers:
            out.extend(reply.headers.items())
        if reply.status == 401:
            out.append(("WWW-Authenticate", "Bearer"))
        start_response(status_line(reply.status), out)
        return [reply.body]

    @staticmethod
    def respond_streamed(start_response: Callable, reply, rid_text: str):
        """A streamed answer, as TorchServe sends it: ``Transfer-Encoding: chunked``, one HTTP
        chunk per intermediate response, the final answer last. Status and headers are the
        first part's."""
        # no Content-Length: gunicorn frames the body as chunks (HTTP/1.1) and writes each
        # part as it is yielded
        out = [("Content-Type", reply.content_type), ("x-request-id", rid_text)]
        if reply.headers:
            out.extend(reply.headers.items())
        start_response(status_line(reply.status), out)

        def parts():
            if reply.body:
                yield reply.body
            for body in reply.stream:
                if body:  # an empty chunk would end the chunked body early
                    yield body

        return parts()

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

    @staticmethod
    def parse_inputs(environ: dict[str, Any], body: bytes) -> tuple[list[tuple[str, str]], list[bytes]]:
        content_type = environ.get("CONTENT_TYPE") or ""
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

    @staticmethod
    def forwarded_headers(environ: dict[str, Any]) -> dict[str, str]:
        headers = {}
        for key, value in environ.items():
            if key.startswith("HTTP_"):
                name = key[5:].replace("_", "-").lower()
                if name not in _SKIPPED_HEADERS:
                    headers[name] = value
        if environ.get("CONTENT_TYPE"):
            headers["content-type"] = environ["CONTENT_TYPE"]
        return headers


def request_timeout_ms(environ: dict[str, Any]) -> float | None:
    """The client's own queue deadline from ``X-Request-Timeout-Ms``, if it sent one."""
    value = environ.get("HTTP_X_REQUEST_TIMEOUT_MS")
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
