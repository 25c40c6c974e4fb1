"""The metrics API: ``GET /metrics`` in Prometheus text format, rendered by the controller;
``?name[]=a&name[]=b`` keeps the samples of those names, as in TorchServe.

The port takes no token (as TorchServe's), and a rendering costs the controller milliseconds:
renderings are asked one at a time and spaced (``AsyncBridge.ask_open``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from mservd.errors import MethodNotAllowed, ResourceNotFound
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.http.request import Answer, HttpRequest

TIMEOUT = 30.0  # seconds


class MetricsRoutes:
    def __init__(self, bridge: AsyncBridge) -> None:
        self.bridge = bridge

    async def answer(self, request: HttpRequest, scope: dict[str, Any]) -> Answer:
        if request.path != "/metrics":
            raise ResourceNotFound(f"Requested resource is not found: {request.path}. "
                                   "Try /metrics.")
        if request.method != "GET":
            raise MethodNotAllowed("Use GET /metrics.")
        names = sorted(set(parse_qs(request.query).get("name[]", [])))
        # one address may have a few renderings waiting, not the whole lane: names it makes up
        # are questions no one shares
        reply = await self.bridge.ask_open("metrics", {"names": names}, None, TIMEOUT,
                                           client=request.client)
        return Answer(reply.status, reply.body, reply.content_type)
