"""The Open Inference Protocol v2 over REST, on the inference address (docs/v2.md).

Routes (``{m}`` a model name, ``/versions/{v}`` optional everywhere a model is named)::

    GET  /v2                          server metadata: name, version, extensions
    GET  /v2/health/live              200 while the frontend and controller answer
    GET  /v2/health/ready             200 when the start-up models have live workers (/ping)
    GET  /v2/models/{m}               model metadata (controller verb v2_model_metadata)
    GET  /v2/models/{m}/ready         200 when a worker is live (controller verb v2_model_ready)
    POST /v2/models/{m}/infer         forwarded as one PREDICT input; the worker decodes it

The frontend never decodes an infer body: it forwards the bytes with a content type that marks
them as v2 (and carries Inference-Header-Content-Length), and relays the worker's answer as it
is. Every error is ``{"error": "..."}`` with the status of the failure.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mservd import __version__, protocol
from mservd.errors import (
    BadRequest,
    MethodNotAllowed,
    MservdError,
    ResourceNotFound,
    error_message,
)
from mservd.frontends.bridge import ControllerGone, Reply, bearer_token
from mservd.frontends.http.responses import respond
from mservd.v2.handling import HEADER_LENGTH
from mservd.v2.handling import content_type as v2_content_type

if TYPE_CHECKING:
    from mservd.frontends.http.inference import InferenceApp

log = logging.getLogger(__name__)

SERVER_NAME = "mservd"
EXTENSIONS = ["binary_tensor_data"]
JSON = "application/json"


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}


def handle(app: InferenceApp, environ: dict[str, Any], start_response: Callable,
           path: str) -> list[bytes]:
    """Answer one ``/v2`` request; every failure becomes ``{"error": ...}``."""
    return answer_errors(_route, app, environ, start_response, path)


def answer_errors(route: Callable, app: InferenceApp, environ: dict[str, Any],
                  start_response: Callable, path: str) -> list[bytes]:
    """Run a KServe-style ``route``; every failure it raises becomes ``{"error": ...}``."""
    method = environ["REQUEST_METHOD"]
    try:
        return route(app, environ, start_response, path.rstrip("/"), method)
    except MservdError as exc:
        return error(start_response, exc.http_status, exc.message, exc.headers)
    except ControllerGone as exc:
        return error(start_response, 503, str(exc))


def _route(app: InferenceApp, environ: dict[str, Any], start_response: Callable, path: str,
           method: str) -> list[bytes]:
    parts = path.split("/")[1:]  # ["v2", ...]
    if parts == ["v2"]:
        need_method(method, "GET", path)
        return json_answer(start_response, 200, server_metadata())
    if parts == ["v2", "health", "live"]:
        need_method(method, "GET", path)
        app.bridge.manage("ping", {}, None, 10.0)  # any answer: the controller is alive
        return json_answer(start_response, 200, {"live": True})
    if parts == ["v2", "health", "ready"]:
        need_method(method, "GET", path)
        ready = app.bridge.manage("ping", {}, None, 10.0).status == 200
        return json_answer(start_response, 200 if ready else 503, {"ready": ready})
    if len(parts) >= 3 and parts[1] == "models" and parts[2]:
        model, version, rest = _model_path(parts, path)
        token = bearer_token(environ) if app.auth else None
        if rest is None:
            need_method(method, "GET", path)
            return relay(start_response, app.bridge.manage(
                "v2_model_metadata", {"model": model, "version": version}, token, 10.0,
                api=protocol.API_INFERENCE))
        if rest == "ready":
            need_method(method, "GET", path)
            reply = app.bridge.manage("v2_model_ready", {"model": model, "version": version},
                                      token, 10.0, api=protocol.API_INFERENCE)
            if reply.status == 200 and not json.loads(reply.body).get("ready"):
                return json_answer(start_response, 503, json.loads(reply.body))
            return relay(start_response, reply)
        if rest == "infer":
            need_method(method, "POST", path)
            return infer(app, environ, start_response, model, version, token)
    raise ResourceNotFound(f"Requested resource is not found: {method} {path}. The v2 routes "
                           "are /v2, /v2/health/{live,ready} and "
                           "/v2/models/{model}[/versions/{version}][/ready|/infer].")


def _model_path(parts: list[str], path: str) -> tuple[str, str | None, str | None]:
    """(model, version, what follows) of ``/v2/models/{m}[/versions/{v}][/{rest}]``."""
    model = parts[2]
    tail = parts[3:]
    version = None
    if tail[:1] == ["versions"]:
        if len(tail) < 2 or not tail[1]:
            raise ResourceNotFound(f"Requested resource is not found: {path}. Use "
                                   "/v2/models/{model}/versions/{version}.")
        version, tail = tail[1], tail[2:]
    if len(tail) > 1:
        raise ResourceNotFound(f"Requested resource is not found: {path}.")
    return model, version, tail[0] if tail else None


def infer(app: InferenceApp, environ: dict[str, Any], start_response: Callable, model: str,
          version: str | None, token: str | None) -> list[bytes]:
    body = app.read_body(environ)
    header_length = environ.get("HTTP_" + HEADER_LENGTH.upper().replace("-", "_"))
    length = None
    if header_length is not None:
        try:
            length = int(header_length)
        except ValueError:
            raise BadRequest(f"{HEADER_LENGTH} {header_length!r} is not an integer; send the "
                             "JSON header's length in bytes.") from None
        if not 0 <= length <= len(body):
            raise BadRequest(f"{HEADER_LENGTH} is {length} but the body has {len(body)} "
                             "bytes; send the JSON header's length in bytes.")
    rid_text = str(uuid.uuid4())
    rid = rid_text.encode()
    route = protocol.Route(rid, model, version, token, protocol.API_INFERENCE)
    headers = app.forwarded_headers(environ)
    frames = protocol.predict_frames(
        route, protocol.pack_meta([("v2", v2_content_type(length))], headers, False), [body])
    reply = app.bridge.call(rid, frames, app.reply_timeout)
    return relay(start_response, reply, [("x-request-id", rid_text)])


def relay(start_response: Callable, reply: Reply,
           extra: list[tuple[str, str]] | None = None) -> list[bytes]:
    """The controller's or worker's answer as it is, errors rewritten to ``{"error": ...}``."""
    headers = list((reply.headers or {}).items()) + (extra or [])
    if reply.status >= 400:
        return error(start_response, reply.status, error_message(reply.body), dict(headers))
    return respond(start_response, reply.status, reply.body, reply.content_type, headers)


def error(start_response: Callable, status: int, message: str,
          headers: dict[str, str] | None = None) -> list[bytes]:
    out = [(k, v) for k, v in (headers or {}).items()
           if k.lower() not in ("content-type", "content-length", HEADER_LENGTH.lower())]
    if status == 401:
        out.append(("WWW-Authenticate", "Bearer"))
    return respond(start_response, status, json.dumps({"error": message}).encode(), JSON, out)


def json_answer(start_response: Callable, status: int, doc: Any) -> list[bytes]:
    return respond(start_response, status, json.dumps(doc).encode(), JSON)


def need_method(method: str, wanted: str, path: str) -> None:
    if method != wanted:
        raise MethodNotAllowed(f"Method {method} is not allowed on {path}; use {wanted}.")
