"""The Open Inference Protocol v2 over REST, on the inference address (docs/v2.md).

Routes (``{m}`` a model name, ``/versions/{v}`` optional everywhere a model is named)::

    GET  /v2                          server metadata: name, version, extensions
    GET  /v2/health/live              200 while the frontend and controller answer
    GET  /v2/health/ready             200 when the start-up models have live workers (/ping)
    GET  /v2/models/{m}               model metadata (controller verb v2_model_metadata)
    GET  /v2/models/{m}/ready         200 when a worker is live (controller verb v2_model_ready)
    POST /v2/models/{m}/infer         forwarded as one PREDICT input; the worker decodes it
    POST /v2/models/{m}/generate      Triton's generate extension (a generation model):
    POST /v2/models/{m}/generate_stream  {"text_input", "parameters"} → {"text_output"}, the
                                      stream as server-sent events (mservd/worker/codecs/generate.py)

The frontend never decodes an infer body: it forwards the bytes with a content type that marks
them as v2 (and carries Inference-Header-Content-Length), and relays the worker's answer as it
is. Every error is ``{"error": "..."}`` with the status of the failure
(``request.error_shape``).
"""

from __future__ import annotations

import json
from typing import Any

from mservd import __version__, protocol
from mservd.errors import BadRequest, ResourceNotFound
from mservd.frontends.bridge import client_network
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.request import (
    KSERVE,
    Answer,
    HttpRequest,
    as_events,
    forwarded_headers,
    need_method,
    relay,
)
from mservd.v2.codec import HEADER_LENGTH
from mservd.v2.codec import content_type as v2_content_type

SERVER_NAME = "mservd"
EXTENSIONS = ["binary_tensor_data", "generate"]


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}


def json_answer(status: int, doc: Any) -> Answer:
    return Answer(status, json.dumps(doc).encode())


async def answer(routes: Gateway, request: HttpRequest) -> Answer:
    path = request.path.rstrip("/")
    parts = path.split("/")[1:]  # ["v2", ...]
    if parts == ["v2"]:
        need_method(request, "GET")
        return json_answer(200, server_metadata())
    if parts == ["v2", "health", "live"]:
        need_method(request, "GET")
        await routes.ask("ping", {}, None)  # any answer: the controller is alive
        return json_answer(200, {"live": True})
    if parts == ["v2", "health", "ready"]:
        need_method(request, "GET")
        ready = (await routes.ask("ping", {}, None)).status == 200
        return json_answer(200 if ready else 503, {"ready": ready})
    if len(parts) >= 3 and parts[1] == "models" and parts[2]:
        model, version, rest = _model_path(parts, path)
        token = routes.token(request)
        names = {"model": model, "version": version}
        if rest is None:
            need_method(request, "GET")
            return relay(await routes.ask("v2_model_metadata", names, token), shape=KSERVE)
        if rest == "ready":
            need_method(request, "GET")
            reply = await routes.ask("v2_model_ready", names, token)
            if reply.status == 200 and not json.loads(reply.body).get("ready"):
                return json_answer(503, json.loads(reply.body))
            return relay(reply, shape=KSERVE)
        if rest == "infer":
            need_method(request, "POST")
            return await infer(routes, request, model, version, token)
        if rest in ("generate", "generate_stream"):  # Triton's generate extension
            need_method(request, "POST")

            def frames(rid: bytes, body: bytes) -> list[bytes]:
                return protocol.prediction(rid, model, version, token, protocol.CODEC_GENERATE,
                                           [(rest, "application/json")],
                                           forwarded_headers(request.headers), [body],
                                           timeout_ms=request.timeout_ms(),
                                           client=client_network(request.client))

            return as_events(await routes.forward(request, frames, stream=True, shape=KSERVE),
                             KSERVE)
    raise ResourceNotFound(f"Requested resource is not found: {request.method} {path}. The v2 "
                           "routes are /v2, /v2/health/{live,ready} and "
                           "/v2/models/{model}[/versions/{version}]"
                           "[/ready|/infer|/generate|/generate_stream].")


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


async def infer(routes: Gateway, request: HttpRequest, model: str, version: str | None,
                token: str | None) -> Answer:
    header_length = request.headers.get(HEADER_LENGTH.lower())
    length = None
    if header_length is not None:
        try:
            length = int(header_length)
        except ValueError:
            raise BadRequest(f"{HEADER_LENGTH} {header_length!r} is not an integer; send the "
                             "JSON header's length in bytes.") from None

    def frames(rid: bytes, body: bytes) -> list[bytes]:
        if length is not None and not 0 <= length <= len(body):
            raise BadRequest(f"{HEADER_LENGTH} is {length} but the body has {len(body)} "
                             "bytes; send the JSON header's length in bytes.")
        return protocol.prediction(rid, model, version, token, protocol.CODEC_V2,
                                   [("v2", v2_content_type(length))],
                                   forwarded_headers(request.headers), [body],
                                   timeout_ms=request.timeout_ms(),
                                   client=client_network(request.client))

    return await routes.forward(request, frames, shape=KSERVE)
