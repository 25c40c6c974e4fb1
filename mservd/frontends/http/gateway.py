"""The one way a prediction of any HTTP protocol reaches the controller and comes back.

:meth:`Gateway.forward`, in order: the door (refused at once when its model is over its limit,
``shedding.py``), the token (a stranger is refused before a byte of its body is read), the body
(bounded by ``max_request_size`` and ``frontend_body_timeout``), the PREDICT message the route
builds with :func:`mservd.protocol.prediction`, the trip to the controller (dropped there if the
client hangs up while it waits), and what its answer teaches the door. The frontend never
decodes a payload: the worker does.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from mservd import protocol
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.http.request import JSON, TORCHSERVE, Answer, HttpRequest, relay
from mservd.frontends.http.shedding import Door, Shedder
from mservd.protocol import Reply
from mservd.specs import HttpFrontendSpec

log = logging.getLogger("mservd.frontends.http")

RETRY_AFTER = [("Retry-After", "1")]
CONTROL_TIMEOUT = 10.0  # seconds for ping and metadata questions to the controller

#: ``frames(rid, body)``: the PREDICT message of a request once its body has arrived
FrameBuilder = Callable[[bytes, bytes], list[bytes]]


class Gateway:
    def __init__(self, spec: HttpFrontendSpec, bridge: AsyncBridge,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.bridge = bridge
        self.auth = spec.auth
        self.max_request_size = spec.max_request_size
        self.reply_timeout = spec.reply_timeout
        self.body_timeout = spec.body_timeout
        self.key_header = spec.traffic_key_header  # its value routes among versions
        self.door = Door(spec.max_queue_wait_ms / 1000.0)
        # its timer runs only for a rule that needs it: otherwise it woke every frontend 200
        # times a second, idle or not (~12 ms of CPU a second each), preempting the workers
        self.shedder = Shedder(spec.shed_delay_ms, loop,
                               (lambda seconds: self.door.tick(seconds, log))
                               if spec.max_queue_wait_ms else None)

    def token(self, request: HttpRequest) -> str | None:
        return request.token(self.auth)

    async def ask(self, op: str, args: dict[str, Any], token: str | None) -> Reply:
        """A question for the controller that is not a prediction (ping, metadata, a token):
        anyone may ask most of them, so they are spaced (``AsyncBridge.ask_open``)."""
        return await self.bridge.ask_open(op, args, token, CONTROL_TIMEOUT,
                                          api=protocol.API_INFERENCE)

    async def forward(self, request: HttpRequest, frames: FrameBuilder, stream: bool = False,
                      shape: str = TORCHSERVE, door: bool = True,
                      group: str | None = None) -> Answer:
        """One prediction through the door to the controller and back; the answer is relayed
        as it is, errors in the route's ``shape``. Without ``door`` (a route whose model is
        named in its body) only the controller refuses overload. Requests of one ``group``
        reach one version of a model whose versions share its traffic."""
        path = request.path
        refusal = self.door.refusal(path) if door else None
        if refusal is not None:
            return Answer(503, refusal, JSON, list(RETRY_AFTER))
        if self.auth:  # before a byte of the body is read
            refused = await self.bridge.refusal(self.token(request), protocol.API_INFERENCE,
                                                client=request.client)
            if refused is not None:
                return relay(refused, shape=shape)
        limit = self.door.let_in(path) if door else None
        status, overloaded, body = 500, False, b""
        try:
            self.shedder.check()
            payload = await request.body(self.max_request_size, self.body_timeout)
            rid_text = str(uuid.uuid4())
            rid = rid_text.encode()
            # every protocol's routes get the traffic key here, the one way they all pass
            key = request.headers.get(self.key_header)
            message = protocol.with_key(frames(rid, payload),
                                        key if group is None else protocol.group_key(group, key))
            request.on_hang_up(lambda: self.bridge.cancel(rid))
            self.shedder.busy += 1
            try:
                reply = await self.bridge.call(rid, message, self.reply_timeout, stream=stream)
            finally:
                self.shedder.busy -= 1
            status, body = reply.status, reply.body
            overloaded = refused_as_overload(reply, request)
            if self.auth:
                self.bridge.answered(self.token(request), protocol.API_INFERENCE, status)
        finally:
            if door:
                self.door.answered(path, limit, status, time.perf_counter() - request.started,
                                   overloaded, body)
        answer = relay(reply, [("x-request-id", rid_text)], shape=shape)
        answer.rid = rid_text
        return answer


def refused_as_overload(reply: Reply, request: HttpRequest) -> bool:
    """Whether the controller refused this prediction because its model is overloaded (503
    with Retry-After): what the door learns from. A request with its own deadline
    (``X-Request-Timeout-Ms``) may have been refused for that deadline alone, so it teaches
    the door nothing: else one client's short deadlines would hold every client of the model
    for REFUSAL_HOLD at a time."""
    return (reply.status == 503 and "Retry-After" in (reply.headers or {})
            and request.timeout_ms() is None)
