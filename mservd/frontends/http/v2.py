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
(``request.error_shape``). ``routes.py`` declares the routes and what each answers.
"""

from __future__ import annotations

import json
from typing import Any

from mservd import __version__, protocol
from mservd.errors import BadRequest, MservdError, ResourceNotFound
from mservd.frontends.bridge import client_network
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.request import (
    KSERVE,
    Answer,
    HttpRequest,
    as_events,
    forwarded_headers,
    relay,
)
from mservd.frontends.http.router import Params
from mservd.v2.codec import HEADER_LENGTH
from mservd.v2.codec import content_type as v2_content_type

SERVER_NAME = "mservd"
EXTENSIONS = ["binary_tensor_data", "generate"]


def json_answer(status: int, doc: Any) -> Answer:
    return Answer(status, json.dumps(doc).encode())


async def server_metadata(gateway: Gateway, request: HttpRequest,
                          params: Params) -> Answer:
    return json_answer(200, {"name": SERVER_NAME, "version": __version__,
                             "extensions": list(EXTENSIONS)})


async def server_live(gateway: Gateway, request: HttpRequest, params: Params) -> Answer:
    await gateway.ask("ping", {}, None)  # any answer: the controller is alive
    return json_answer(200, {"live": True})


async def server_ready(gateway: Gateway, request: HttpRequest,
                       params: Params) -> Answer:
    ready = (await gateway.ask("ping", {}, None)).status == 200
    return json_answer(200 if ready else 503, {"ready": ready})


async def model_metadata(gateway: Gateway, request: HttpRequest,
                         params: Params) -> Answer:
    return relay(await gateway.ask("v2_model_metadata", _names(params), gateway.token(request)),
                 shape=KSERVE)


async def model_ready(gateway: Gateway, request: HttpRequest, params: Params) -> Answer:
    reply = await gateway.ask("v2_model_ready", _names(params), gateway.token(request))
    if reply.status == 200 and not json.loads(reply.body).get("ready"):
        return json_answer(503, json.loads(reply.body))
    return relay(reply, shape=KSERVE)


async def generate(gateway: Gateway, request: HttpRequest, params: Params) -> Answer:
    """Triton's generate extension: the whole text."""
    return await _generation(gateway, request, params, "generate")


async def generate_stream(gateway: Gateway, request: HttpRequest,
                          params: Params) -> Answer:
    """Triton's generate extension: the text as server-sent events."""
    return await _generation(gateway, request, params, "generate_stream")


async def _generation(gateway: Gateway, request: HttpRequest, params: Params,
                      kind: str) -> Answer:
    model, version = params["model_name"], params.get("model_version")
    token = gateway.token(request)

    def frames(rid: bytes, body: bytes) -> list[bytes]:
        return protocol.prediction(rid, model, version, token, protocol.CODEC_GENERATE,
                                   [(kind, "application/json")],
                                   forwarded_headers(request.headers), [body],
                                   timeout_ms=request.timeout_ms(),
                                   client=client_network(request.client))

    return as_events(await gateway.forward(request, frames, stream=True, shape=KSERVE), KSERVE)


def _names(params: Params) -> dict[str, str | None]:
    return {"model": params["model_name"], "version": params.get("model_version")}


def not_found(request: HttpRequest) -> MservdError:
    """A path under ``/v2/`` that no route takes; a model's path says what is wrong in it."""
    path = request.path.rstrip("/")
    parts = path.split("/")[1:]  # ["v2", ...]
    if len(parts) >= 3 and parts[1] == "models" and parts[2]:
        tail = parts[3:]  # past the model's name
        if tail[:1] == ["versions"]:
            if len(tail) < 2 or not tail[1]:
                return ResourceNotFound(f"Requested resource is not found: {path}. Use "
                                        "/v2/models/{model}/versions/{version}.")
            tail = tail[2:]
        if len(tail) > 1:
            return ResourceNotFound(f"Requested resource is not found: {path}.")
    return ResourceNotFound(f"Requested resource is not found: {request.method} {path}. The "
                            "v2 routes are /v2, /v2/health/{live,ready} and "
                            "/v2/models/{model}[/versions/{version}]"
                            "[/ready|/infer|/generate|/generate_stream].")


async def infer(gateway: Gateway, request: HttpRequest, params: Params) -> Answer:
    """The body forwarded undecoded; its binary form's header length checked against it."""
    model, version = params["model_name"], params.get("model_version")
    token = gateway.token(request)
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

    return await gateway.forward(request, frames, shape=KSERVE)
