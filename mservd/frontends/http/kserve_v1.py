"""KServe's V1 protocol over REST, on the inference address (docs/v2.md, "KServe V1")::

    GET  /v1/models                   {"models": [names]}
    GET  /v1/models/{m}               {"name": m, "ready": bool} (503 when not ready)
    POST /v1/models/{m}:predict       {"instances": [...]} → {"predictions": [...]}

Like v2, the predict body is forwarded untouched as one PREDICT input; the worker turns each
instance into a row of the handler's batch (mservd/kserve_v1.py). Errors are ``{"error": ...}``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mservd import kserve_v1, protocol
from mservd.errors import ResourceNotFound
from mservd.frontends.bridge import bearer_token
from mservd.frontends.http.v2 import answer_errors, json_answer, need_method, relay

if TYPE_CHECKING:
    from mservd.frontends.http.inference import InferenceApp


def handle(app: InferenceApp, environ: dict[str, Any], start_response: Callable,
           path: str) -> list[bytes]:
    """Answer one ``/v1/models`` request; every failure becomes ``{"error": ...}``."""
    return answer_errors(_route, app, environ, start_response, path)


def _route(app: InferenceApp, environ: dict[str, Any], start_response: Callable, path: str,
           method: str) -> list[bytes]:
    token = bearer_token(environ) if app.auth else None
    parts = path.split("/")[1:]  # ["v1", "models", ...]
    if parts == ["v1", "models"]:
        need_method(method, "GET", path)
        reply = app.bridge.manage("list", {"limit": 10_000}, token, 10.0,
                                  api=protocol.API_INFERENCE)
        if reply.status != 200:
            return relay(start_response, reply)
        names = [m["modelName"] for m in json.loads(reply.body)["models"]]
        return json_answer(start_response, 200, {"models": names})
    if len(parts) == 3 and parts[1] == "models" and parts[2]:
        name, _, verb = parts[2].partition(":")
        if not verb:
            need_method(method, "GET", path)
            reply = app.bridge.manage("v2_model_ready", {"model": name, "version": None},
                                      token, 10.0, api=protocol.API_INFERENCE)
            if reply.status != 200:
                return relay(start_response, reply)
            ready = bool(json.loads(reply.body).get("ready"))
            return json_answer(start_response, 200 if ready else 503,
                               {"name": name, "ready": ready})
        if verb == "predict":
            need_method(method, "POST", path)
            return predict(app, environ, start_response, name, token)
    raise ResourceNotFound(f"Requested resource is not found: {method} {path}. The KServe V1 "
                           "routes are /v1/models and /v1/models/{model}[:predict].")


def predict(app: InferenceApp, environ: dict[str, Any], start_response: Callable, model: str,
            token: str | None) -> list[bytes]:
    body = app.read_body(environ)
    rid_text = str(uuid.uuid4())
    rid = rid_text.encode()
    route = protocol.Route(rid, model, None, token, protocol.API_INFERENCE)
    meta = protocol.pack_meta([("body", kserve_v1.CONTENT_TYPE)],
                              app.forwarded_headers(environ), False)
    reply = app.bridge.call(rid, protocol.predict_frames(route, meta, [body]), app.reply_timeout)
    return relay(start_response, reply, [("x-request-id", rid_text)])
