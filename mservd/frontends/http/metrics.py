"""The metrics API: ``GET /metrics`` in Prometheus text format, rendered by the controller;
``?name[]=a&name[]=b`` keeps the samples of those names, as in TorchServe.

The port takes no token (as TorchServe's), and a rendering costs the controller milliseconds:
renderings are asked one at a time and spaced (``AsyncBridge.ask_open``). ``routes.py``
declares the route.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from mservd.errors import MethodNotAllowed, MservdError, ResourceNotFound
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.http.request import Answer, HttpRequest
from mservd.frontends.http.router import Params

TIMEOUT = 30.0  # seconds


async def metrics(bridge: AsyncBridge, request: HttpRequest, params: Params) -> Answer:
    names = sorted(set(parse_qs(request.query).get("name[]", [])))
    # one address may have a few renderings waiting, not the whole lane: names it makes up
    # are questions no one shares
    reply = await bridge.ask_open("metrics", {"names": names}, None, TIMEOUT,
                                  client=request.client)
    return Answer(reply.status, reply.body, reply.content_type)


def wrong_method(request: HttpRequest, wanted: str) -> MservdError:
    return MethodNotAllowed(f"Use {wanted} /metrics.")


def not_found(request: HttpRequest) -> MservdError:
    return ResourceNotFound(f"Requested resource is not found: {request.path}. Try /metrics.")
