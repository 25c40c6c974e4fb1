"""Questions anyone may make the controller answer, asked one at a time and spaced.

A health check, a scrape of ``/metrics`` and the check of a stranger's token cost the
controller — the one process every prediction passes — as much as a prediction or more
(~150 µs for a ping, milliseconds for a rendering of the metrics), and no token stands
before them. So each frontend process asks them through one :class:`SpacedQuestions`, its
bridge's (``AsyncBridge.ask_open``): one at a time, the next starting no sooner after the
last ended than ``SPACING`` times what the last took, so a flood of them holds the controller
a tenth of its time per frontend process at most. Askers of the same question (same key)
that arrive before it starts share its answer; one that arrives while it runs waits for the
next, so no answer is older than its question. A lone question waits for nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from mservd.errors import MservdError

SPACING = 9.0  # a question's time, times this, passes before the next one starts
MAX_WAITING = 64  # different questions waiting at once; past it the asker is refused

T = TypeVar("T")


class TooManyQuestions(MservdError):
    http_status = 503
    type = "ServiceUnavailableException"


class SpacedQuestions(Generic[T]):
    def __init__(self, ask: Callable[[Hashable], Awaitable[T]], what: str) -> None:
        self.ask = ask  # the question for a key, put to the controller
        self.what = what  # what the questions are, for the refusal's message
        self.waiting: dict[Hashable, asyncio.Future[T]] = {}  # by key, oldest first
        self.next_start = 0.0  # loop time before which no question starts
        self._asker: asyncio.Task | None = None

    async def answer(self, key: Hashable) -> T:
        """The answer to the next question ``key`` asked from now."""
        waiting = self.waiting.get(key)
        if waiting is None:
            if len(self.waiting) >= MAX_WAITING:
                raise TooManyQuestions(f"{MAX_WAITING} {self.what} are waiting for the "
                                       "controller; retry later.", headers={"Retry-After": "1"})
            loop = asyncio.get_running_loop()
            waiting = self.waiting[key] = loop.create_future()
            # its error is each asker's; retrieved here too, should every asker hang up
            waiting.add_done_callback(lambda done: done.cancelled() or done.exception())
            if self._asker is None:
                self._asker = loop.create_task(self._ask_in_turn())
        return await asyncio.shield(waiting)  # an asker that hangs up leaves it to the rest

    async def _ask_in_turn(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.waiting:
                await asyncio.sleep(max(0.0, self.next_start - loop.time()))
                key = next(iter(self.waiting))  # the longest waiting
                waiting = self.waiting.pop(key)
                started = loop.time()
                try:
                    waiting.set_result(await self.ask(key))
                except Exception as exc:  # the controller gone: each asker hears it
                    waiting.set_exception(exc)
                ended = loop.time()
                self.next_start = ended + SPACING * (ended - started)
        finally:
            self._asker = None
