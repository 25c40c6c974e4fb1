"""KServe's V1 protocol over REST, on the inference address (docs/v2.md, "KServe V1")::

    GET  /v1/models                   {"models": [names]}
    GET  /v1/models/{m}               {"name": m, "ready": bool} (503 when not ready)
    POST /v1/models/{m}:predict       {"instances": [...]} → {"predictions": [...]}

OpenAI's API owns the same two GET routes (``/v1/models`` lists models, ``/v1/models/{id}``
retrieves one, also under ``/openai/v1``): each answer is one document with both shapes, so a
KServe client reads ``models``/``name``/``ready`` and an OpenAI client ``object``/``data``/``id``.
An error there (an unknown model, a missing token) has one shape only, so it is told by its
caller (:func:`caller_shape`): OpenAI's ``{"error": {"message", "type", "param", "code"}}``
under ``/openai/v1`` and to an OpenAI SDK (its ``User-Agent`` starts ``OpenAI/``, as the Python
and JavaScript SDKs' do, or it sends their ``X-Stainless-Lang`` header: LangChain and most
OpenAI-compatible tools call through them), KServe's ``{"error": "..."}`` to anyone else. The
``Authorization: Bearer`` header tells nothing: every client sends it when tokens are on.

Like v2, the predict body is forwarded untouched as one PREDICT input; the worker turns each
instance into a row of the handler's batch (mservd/worker/codecs/kserve_v1.py). Errors are
``{"error": ...}`` (``request.error_shape``). ``routes.py`` declares the routes.
"""

from __future__ import annotations

import json

from mservd import protocol
from mservd.errors import MservdError, ResourceNotFound
from mservd.frontends.bridge import client_network
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.request import (
    KSERVE,
    OPENAI,
    Answer,
    HttpRequest,
    forwarded_headers,
    relay,
)
from mservd.frontends.http.router import Params


def openai_model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "mservd"}


async def list_models(gateway: Gateway, request: HttpRequest,
                      params: Params) -> Answer:
    """``GET /v1/models``: KServe's ``models`` and OpenAI's ``data``."""
    reply = await gateway.ask("list", {"limit": 10_000}, gateway.token(request))
    if reply.status != 200:
        return relay(reply, shape=caller_shape(request))
    names = [m["modelName"] for m in json.loads(reply.body)["models"]]
    return Answer(200, json.dumps({"models": names, "object": "list",
                                   "data": [openai_model(n) for n in names]}).encode())


async def model_ready(gateway: Gateway, request: HttpRequest,
                      params: Params) -> Answer:
    """``GET /v1/models/{m}``: 503 when the model's default version is not ready."""
    name = params["model_name"]
    reply = await gateway.ask("v2_model_ready", {"model": name, "version": None},
                              gateway.token(request))
    if reply.status == 404 and caller_shape(request) == OPENAI:
        return Answer(404, json.dumps({"error": {
            "message": f"The model {name!r} does not exist.", "type": "invalid_request_error",
            "param": "model", "code": "model_not_found"}}).encode())
    if reply.status != 200:
        return relay(reply, shape=caller_shape(request))
    ready = bool(json.loads(reply.body).get("ready"))
    return Answer(200 if ready else 503, json.dumps(
        {"name": name, "ready": ready, **openai_model(name)}).encode())


async def predict(gateway: Gateway, request: HttpRequest, params: Params) -> Answer:
    """``POST /v1/models/{m}:predict``, the body forwarded as it came."""
    name = params["model_name"]
    token = gateway.token(request)

    def frames(rid: bytes, body: bytes) -> list[bytes]:
        return protocol.prediction(
            rid, name, None, token, protocol.CODEC_KSERVE_V1,
            [("body", request.headers.get("content-type", ""))],
            forwarded_headers(request.headers), [body], timeout_ms=request.timeout_ms(),
            client=client_network(request.client))

    return await gateway.forward(request, frames, shape=KSERVE)


def caller_shape(request: HttpRequest) -> str:
    """OpenAI's error shape for a path under ``/openai`` or an OpenAI SDK's request, else
    KServe's: the two APIs share ``/v1/models``."""
    agent = request.headers.get("user-agent", "")
    if (request.path.startswith("/openai/") or agent.startswith("OpenAI/")
            or "x-stainless-lang" in request.headers):
        return OPENAI
    return KSERVE


def not_found(request: HttpRequest) -> MservdError:
    """A path under ``/v1/models`` (or ``/openai/v1/models``) that no route takes."""
    path = request.path.removeprefix("/openai").rstrip("/")
    return ResourceNotFound(f"Requested resource is not found: {request.method} {path}. The "
                            "KServe V1 routes are /v1/models and /v1/models/{model}[:predict].")
