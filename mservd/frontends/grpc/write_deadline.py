"""Streaming calls whose client stops reading: ended after ``frontend_write_timeout``.

grpc.aio writes a streaming servicer's answers one at a time: it resumes the servicer's
generator only once the last answer is on its way, which HTTP/2's flow control holds up while
the client reads nothing. So a servicer that stops at each ``yield`` buffers nothing more, but
its call would wait forever, and whatever feeds it (a generation's parts, the answers to a
stream of requests) would pile up behind it. :class:`WriteDeadline` gives each answer
``seconds`` to be taken, as the HTTP frontends give a client that stops reading: past it the
call's requests are dropped (``on_expiry``), the servicer's task is cancelled, and the call
ends RESOURCE_EXHAUSTED (the status reaches a client that reads again; one that never does
holds one answer until it goes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

import grpc

from mservd.frontends.log_throttle import throttled

log = throttled(__name__)  # a stranger's calls could be slow readers too: lines capped
_ENDING: set[asyncio.Task] = set()  # calls' statuses being sent: kept until sent


class WriteDeadline:
    """One streaming call's deadline on each answer: made in the task that writes them (the
    servicer's own), armed around each ``yield`` with :meth:`writing`."""

    def __init__(self, context: grpc.aio.ServicerContext, method: str, seconds: float,
                 on_expiry: Callable[[], None]) -> None:
        self.context = context
        self.method = method
        self.seconds = seconds
        self.on_expiry = on_expiry
        self.task = asyncio.current_task()
        self.expired = False

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around one ``yield`` of an answer: the time the client takes to read it."""
        timer = asyncio.get_running_loop().call_later(self.seconds, self._expire)
        try:
            yield
        finally:
            timer.cancel()

    def _expire(self) -> None:
        self.expired = True
        log.warning("a %s call's client took no answer for %.0f s (frontend_write_timeout): "
                    "its requests are dropped and the call ends", self.method, self.seconds)
        self.on_expiry()
        ending = asyncio.ensure_future(self._end())
        _ENDING.add(ending)
        ending.add_done_callback(_ENDING.discard)
        if self.task is not None:
            self.task.cancel()

    async def _end(self) -> None:
        """The call's status, sent after the answer the client has not taken."""
        with contextlib.suppress(Exception):  # AbortError, always; a call already over
            await self.context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"The client took no answer of this {self.method} call for "
                f"{self.seconds:.0f} s (frontend_write_timeout); the call ended and its "
                "requests were dropped. Read the answers as they come.")
