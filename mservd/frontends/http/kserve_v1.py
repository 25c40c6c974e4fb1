"""KServe's V1 protocol over REST, on the inference address (docs/v2.md, "KServe V1")::

    GET  /v1/models                   {"models": [names]}
    GET  /v1/models/{m}               {"name": m, "ready": bool} (503 when not ready)
    POST /v1/models/{m}:predict       {"instances": [...]} → {"predictions": [...]}

OpenAI's API owns the same two GET routes (``/v1/models`` lists models, ``/v1/models/{id}``
retrieves one, also under ``/openai/v1``): each answer is one document with both shapes, so a
KServe client reads ``models``/``name``/``ready`` and an OpenAI client ``object``/``data``/``id``.

Like v2, the predict body is forwarded untouched as one PREDICT input; the worker turns each
instance into a row of the handler's batch (mservd/worker/codecs/kserve_v1.py). Errors are
``{"error": ...}`` (``request.error_shape``).
"""

from __future__ import annotations

import json

from mservd import protocol
from mservd.errors import ResourceNotFound
from mservd.frontends.bridge import client_network
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.request import (
    KSERVE,
    Answer,
    HttpRequest,
    forwarded_headers,
    need_method,
    relay,
)


def openai_model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "mservd"}


async def answer(routes: Gateway, request: HttpRequest, path: str) -> Answer:
    path = path.rstrip("/")
    parts = path.split("/")[1:]  # ["v1", "models", ...]
    token = routes.token(request)
    if parts == ["v1", "models"]:
        need_method(request, "GET")
        reply = await routes.ask("list", {"limit": 10_000}, token)
        if reply.status != 200:
            return relay(reply, shape=KSERVE)
        names = [m["modelName"] for m in json.loads(reply.body)["models"]]
        return Answer(200, json.dumps({"models": names, "object": "list",
                                       "data": [openai_model(n) for n in names]}).encode())
    if len(parts) == 3 and parts[1] == "models" and parts[2]:
        name, _, verb = parts[2].partition(":")
        if not verb:
            need_method(request, "GET")
            reply = await routes.ask("v2_model_ready", {"model": name, "version": None}, token)
            if reply.status != 200:
                return relay(reply, shape=KSERVE)
            ready = bool(json.loads(reply.body).get("ready"))
            return Answer(200 if ready else 503, json.dumps(
                {"name": name, "ready": ready, **openai_model(name)}).encode())
        if verb == "predict":
            need_method(request, "POST")

            def frames(rid: bytes, body: bytes) -> list[bytes]:
                return protocol.prediction(
                    rid, name, None, token, protocol.CODEC_KSERVE_V1,
                    [("body", request.headers.get("content-type", ""))],
                    forwarded_headers(request.headers), [body], timeout_ms=request.timeout_ms(),
                    client=client_network(request.client))

            return await routes.forward(request, frames, shape=KSERVE)
    raise ResourceNotFound(f"Requested resource is not found: {request.method} {path}. The "
                           "KServe V1 routes are /v1/models and /v1/models/{model}[:predict].")
