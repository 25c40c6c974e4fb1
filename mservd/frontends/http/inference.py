"""The inference port's routes, all on the worker's event loop.

``/predictions`` and ``/explanations`` (TorchServe), ``/v1/models`` (KServe v1, ``kserve_v1.py``),
``/v2`` (Open Inference Protocol v2, ``v2.py``), ``/ping`` and the OpenAPI document. Every
prediction, whatever its protocol, passes :meth:`InferenceRoutes.forward`: the door (refused at
once when its model is over its limit), the token (a stranger is refused before a byte of its
body is read), the body (bounded by ``max_request_size``), the trip to
the controller (dropped there if the client hangs up while it waits), and what its answer
teaches the door. The frontend never decodes a payload: the worker does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from mservd import protocol
from mservd.errors import BadRequest, MethodNotAllowed, ResourceNotFound
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.bridge import Reply, bearer_token
from mservd.frontends.http.app import JSON, Answer, HttpRequest
from mservd.frontends.http.shedding import Door, Shedder

log = logging.getLogger("mservd.frontends.http")

_SKIPPED_HEADERS = frozenset({"authorization", "cookie"})
RETRY_AFTER = [("Retry-After", "1")]
CONTROL_TIMEOUT = 10.0  # seconds for ping and metadata questions to the controller
TOKEN_MEMORY = 5.0  # seconds a token the controller accepted is taken without asking again


class InferenceRoutes:
    def __init__(self, spec: dict[str, Any], bridge: AsyncBridge,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.bridge = bridge
        self.auth = bool(spec["auth"])
        self.max_request_size = int(spec["max_request_size"])
        self.reply_timeout = float(spec["reply_timeout"])
        self.body_timeout = float(spec["body_timeout"])
        self.door = Door(float(spec.get("max_queue_wait_ms", 0)) / 1000.0)
        self.authorized: dict[str | None, float] = {}  # token -> until when it is taken
        self.shedder = Shedder(float(spec.get("shed_delay_ms", 0)), loop,
                               lambda seconds: self.door.tick(seconds, log))

    async def answer(self, request: HttpRequest, scope: dict[str, Any]) -> Answer:
        path = request.path
        if path.startswith(("/predictions/", "/explanations/")):
            return await self.predict(request)
        if path.startswith("/v1/models"):
            from mservd.frontends.http import kserve_v1  # KServe's V1 protocol

            return await kserve_v1.answer(self, request)
        if path == "/v2" or path.startswith("/v2/"):
            from mservd.frontends.http import v2  # Open Inference Protocol v2 (docs/v2.md)

            return await v2.answer(self, request)
        if path == "/ping":
            need_method(request, "GET")
            return relay(await self.ask("ping", {}, None))
        if path in ("/", "/api-description"):  # OpenAPI 3; no token, as in TorchServe
            from mservd.frontends.http.openapi import inference_api

            need_method(request, "OPTIONS" if path == "/" else "GET")
            return Answer(200, json.dumps(inference_api(), indent=2).encode())
        raise ResourceNotFound(f"Requested resource is not found: {request.method} {path}. "
                               "Try POST /predictions/{model_name}.")

    async def authorize(self, request: HttpRequest) -> Reply | None:
        """The controller's refusal of this request's token, asked before its body is read,
        or None. Tokens it accepted are remembered for TOKEN_MEMORY seconds, so a client's
        requests pay this once; the controller still checks each prediction itself."""
        token = self.token(request)
        now = time.monotonic()
        if token is not None and self.authorized.get(token, 0.0) > now:
            return None
        reply = await self.ask("authorize", {}, token)
        if reply.status != 200:
            return reply
        if len(self.authorized) >= 16:  # keys are few; anything else is stale
            self.authorized.clear()
        self.authorized[token] = now + TOKEN_MEMORY
        return None

    def token(self, request: HttpRequest) -> str | None:
        return bearer_token(request.headers.get("authorization")) if self.auth else None

    async def ask(self, op: str, args: dict[str, Any], token: str | None) -> Reply:
        """A question for the controller that is not a prediction (ping, metadata)."""
        return await self.bridge.manage(op, args, token, CONTROL_TIMEOUT,
                                        api=protocol.API_INFERENCE)

    # -- predictions ---------------------------------------------------------------------

    async def predict(self, request: HttpRequest) -> Answer:
        """``POST /predictions/{model}[/{version}]`` and ``/explanations/...``."""
        if request.method not in ("POST", "PUT"):
            raise MethodNotAllowed(f"Method {request.method} is not allowed on {request.path}; "
                                   "use POST.")
        parts = request.path.split("/")
        if len(parts) not in (3, 4) or not parts[2]:
            raise ResourceNotFound(f"Requested resource is not found: {request.path}. "
                                   "Use /predictions/{model_name}[/{version}].")
        model = parts[2]
        version = parts[3] if len(parts) == 4 and parts[3] else None
        explain = parts[1] == "explanations"
        headers = request.headers

        def frames(rid: bytes, body: bytes) -> list[bytes]:
            # the body as it came, a form too: the worker splits a form into its fields, once
            # the controller has checked the token
            inputs = [("body", headers.get("content-type", ""))]
            forwarded = forwarded_headers(headers)
            if explain:
                forwarded["explain"] = "True"
            route = protocol.Route(rid, model, version, self.token(request),
                                   protocol.API_INFERENCE,
                                   request_timeout_ms(headers.get("x-request-timeout-ms")))
            return protocol.predict_frames(route, protocol.pack_meta(inputs, forwarded, explain),
                                           [body])

        return await self.forward(request, frames, stream=True)

    async def forward(self, request: HttpRequest, frames: Callable[[bytes, bytes], list[bytes]],
                      stream: bool = False, kserve: bool = False) -> Answer:
        """One prediction of any protocol through the door to the controller and back.

        ``frames(rid, body)`` builds its PREDICT message; the answer is relayed as it is
        (``kserve``: errors rewritten to ``{"error": ...}``)."""
        path = request.path
        refusal = self.door.refusal(path)
        if refusal is not None:
            return Answer(503, refusal, JSON, RETRY_AFTER)
        if self.auth:
            refused = await self.authorize(request)
            if refused is not None:
                return relay(refused, kserve=kserve)
        limit = self.door.let_in(path)
        status, retry_after, body = 500, False, b""
        try:
            self.shedder.check()
            payload = await request.body(self.max_request_size, self.body_timeout)
            rid_text = str(uuid.uuid4())
            rid = rid_text.encode()
            message = frames(rid, payload)
            request.on_hang_up(lambda: self.bridge.cancel(rid))
            self.shedder.busy += 1
            try:
                reply = await self.bridge.call(rid, message, self.reply_timeout, stream=stream)
            finally:
                self.shedder.busy -= 1
            status, body = reply.status, reply.body
            retry_after = "Retry-After" in (reply.headers or {})
        finally:
            self.door.answered(path, limit, status, time.perf_counter() - request.started,
                               retry_after, body)
        answer = relay(reply, [("x-request-id", rid_text)], kserve=kserve)
        answer.rid = rid_text
        return answer


def relay(reply: Reply, extra: list[tuple[str, str]] | None = None,
          kserve: bool = False) -> Answer:
    """The controller's or worker's answer as it is (``kserve``: errors as ``{"error": ...}``)."""
    from mservd.errors import error_message
    from mservd.v2.handling import HEADER_LENGTH

    headers = list((reply.headers or {}).items()) + (extra or [])
    if reply.status == 401:
        headers.append(("WWW-Authenticate", "Bearer"))
    if kserve and reply.status >= 400:
        kept = [(k, v) for k, v in headers
                if k.lower() not in ("content-type", "content-length", HEADER_LENGTH.lower())]
        body = json.dumps({"error": error_message(reply.body)}).encode()
        return Answer(reply.status, body, JSON, kept)
    return Answer(reply.status, reply.body, reply.content_type, headers, reply.stream)


def need_method(request: HttpRequest, wanted: str) -> None:
    if request.method != wanted:
        raise MethodNotAllowed(f"Method {request.method} is not allowed on {request.path}; "
                               f"use {wanted}.")


def forwarded_headers(headers: dict[str, str]) -> dict[str, str]:
    """The request headers a handler sees (lower-case names), without credentials."""
    return {name: value for name, value in headers.items() if name not in _SKIPPED_HEADERS}


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
