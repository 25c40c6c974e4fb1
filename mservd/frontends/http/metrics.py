"""The metrics API: ``GET /metrics`` in Prometheus text format, rendered by the controller;
``?name[]=a&name[]=b`` keeps the samples of those names, as in TorchServe.

The port takes no token (as TorchServe's), and a rendering costs the controller — the one
process every prediction passes — a few milliseconds. So each frontend process asks for one
rendering at a time, and spaces them: one starts no sooner after the last ended than
``SPACING`` times what the last took, so a flood of scrapes holds the controller a tenth of
its time per frontend process at most. A scrape that arrives while a rendering is under way
waits for the next one, which starts after it arrived: an answer is never older than its
request. A lone scrape waits for nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs

from mservd.errors import MethodNotAllowed, ResourceNotFound
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.http.request import Answer, HttpRequest
from mservd.frontends.http.shedding import Overloaded
from mservd.protocol import Reply

TIMEOUT = 30.0  # seconds
SPACING = 9.0  # a rendering's time, times this, passes before the next one starts
MAX_WAITING = 64  # different name[] selections waiting at once; past it 503


class MetricsRoutes:
    def __init__(self, bridge: AsyncBridge) -> None:
        self.bridge = bridge
        self.waiting: dict[tuple[str, ...], asyncio.Future[Reply]] = {}  # by selection
        self.next_start = 0.0  # loop time before which no rendering starts
        self._renderer: asyncio.Task | None = None

    async def answer(self, request: HttpRequest, scope: dict[str, Any]) -> Answer:
        if request.path != "/metrics":
            raise ResourceNotFound(f"Requested resource is not found: {request.path}. "
                                   "Try /metrics.")
        if request.method != "GET":
            raise MethodNotAllowed("Use GET /metrics.")
        names = tuple(sorted(set(parse_qs(request.query).get("name[]", []))))
        reply = await self.rendering(names)
        return Answer(reply.status, reply.body, reply.content_type)

    async def rendering(self, names: tuple[str, ...]) -> Reply:
        """The controller's next rendering of the ``names`` selection (all: empty)."""
        waiting = self.waiting.get(names)
        if waiting is None:
            if len(self.waiting) >= MAX_WAITING:
                raise Overloaded(f"{MAX_WAITING} different metrics selections are waiting "
                                 "to be rendered; retry later.", headers={"Retry-After": "1"})
            waiting = self.waiting[names] = asyncio.get_running_loop().create_future()
            # its error is each waiter's; retrieved here too, should every waiter hang up
            waiting.add_done_callback(lambda done: done.cancelled() or done.exception())
            if self._renderer is None:
                self._renderer = asyncio.get_running_loop().create_task(self._render())
        return await asyncio.shield(waiting)  # a client that hangs up leaves it to the rest

    async def _render(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.waiting:
                await asyncio.sleep(max(0.0, self.next_start - loop.time()))
                names = next(iter(self.waiting))  # the longest waiting
                waiting = self.waiting.pop(names)
                started = loop.time()
                try:
                    waiting.set_result(await self.bridge.manage(
                        "metrics", {"names": list(names)}, None, TIMEOUT))
                except Exception as exc:  # the controller gone: each waiter hears it
                    waiting.set_exception(exc)
                ended = loop.time()
                self.next_start = ended + SPACING * (ended - started)
        finally:
            self._renderer = None
