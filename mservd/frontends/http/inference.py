"""The inference port's routes, all on the worker's event loop.

``/predictions`` and ``/explanations`` (TorchServe, here), ``/v1/models`` (KServe v1 and
OpenAI's model list, ``kserve_v1.py``), ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings`` (OpenAI, ``openai.py``, also under ``/openai/v1``), ``/v2`` (Open Inference
Protocol v2, ``v2.py``), ``/ping`` and the OpenAPI document. Every prediction, whatever its protocol, passes the one :class:`~.gateway.Gateway`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mservd import protocol
from mservd.errors import MethodNotAllowed, ResourceNotFound
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.bridge import client_network
from mservd.frontends.http import kserve_v1, openai, v2
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.openapi import inference_api
from mservd.frontends.http.request import (
    OPENAI_PATHS,
    Answer,
    HttpRequest,
    forwarded_headers,
    need_method,
    relay,
)
from mservd.specs import HttpFrontendSpec


class InferenceRoutes:
    def __init__(self, spec: HttpFrontendSpec, bridge: AsyncBridge,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.gateway = Gateway(spec, bridge, loop)
        self.door = self.gateway.door  # the connections ask it before a request is parsed

    async def answer(self, request: HttpRequest, scope: dict[str, Any]) -> Answer:
        path = request.path
        if path.startswith(("/predictions/", "/explanations/")):
            return await self.predict(request)
        if path.startswith(OPENAI_PATHS):
            if path.startswith(("/openai/v1/models", "/v1/models")):
                return await kserve_v1.answer(self.gateway, request,
                                              path.removeprefix("/openai"))
            return await openai.answer(self.gateway, request)
        if path.startswith("/v1/models"):
            return await kserve_v1.answer(self.gateway, request, path)
        if path == "/v2" or path.startswith("/v2/"):
            return await v2.answer(self.gateway, request)
        if path == "/ping":
            need_method(request, "GET")
            return relay(await self.gateway.ask("ping", {}, None))
        if path in ("/", "/api-description"):  # OpenAPI 3; no token, as in TorchServe
            need_method(request, "OPTIONS" if path == "/" else "GET")
            return Answer(200, json.dumps(inference_api(), indent=2).encode())
        raise ResourceNotFound(f"Requested resource is not found: {request.method} {path}. "
                               "Try POST /predictions/{model_name}.")

    async def predict(self, request: HttpRequest) -> Answer:
        """``POST /predictions/{model}[/{version}[/{url_path}]]`` and ``/explanations/...``:
        as in TorchServe, a path past the version reaches the handler as the ``url_path``
        request header, and a GET is a prediction with an empty body."""
        if request.method not in ("POST", "PUT", "GET"):
            raise MethodNotAllowed(f"Method {request.method} is not allowed on {request.path}; "
                                   "use POST.")
        parts = request.path.split("/", 4)
        if not parts[2]:
            raise ResourceNotFound(f"Requested resource is not found: {request.path}. "
                                   "Use /predictions/{model_name}[/{version}].")
        model = parts[2]
        version = parts[3] if len(parts) >= 4 and parts[3] else None
        headers = request.headers
        if len(parts) == 5:  # the path past the version, as TorchServe hands it on
            headers = {**headers, "url_path": parts[4]}
        timeout_ms = request.timeout_ms()
        token = self.gateway.token(request)

        def frames(rid: bytes, body: bytes) -> list[bytes]:
            # the body as it came, a form too: the worker splits a form into its fields, once
            # the controller has checked the token
            return protocol.prediction(
                rid, model, version, token, protocol.CODEC_TORCHSERVE,
                [("body", headers.get("content-type", ""))], forwarded_headers(headers), [body],
                explain=parts[1] == "explanations", timeout_ms=timeout_ms,
                client=client_network(request.client))

        return await self.gateway.forward(request, frames, stream=True)
