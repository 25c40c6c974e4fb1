"""Questions anyone may make the controller answer, asked one at a time and spaced, in lanes.

A health check, a scrape of ``/metrics`` and the check of a stranger's token cost the
controller — the one process every prediction passes — as much as a prediction or more
(~150 µs for a ping, milliseconds for a rendering of the metrics), and no token stands
before them. So each frontend process asks them through one :class:`SpacedQuestions`, its
bridge's (``AsyncBridge.ask_open``): one at a time, the next starting no sooner after the
last ended than ``SPACING`` times what the last took, so a flood of them holds the controller
a tenth of its time per frontend process at most. Askers of the same question (same key)
that arrive before it starts share its answer; one that arrives while it runs waits for the
next, so no answer is older than its question. A lone question waits for nothing.

The questions wait in *lanes* (health, metrics, tokens, the rest), each with its own bound of
MAX_WAITING, and the lanes take turns: a flood of strangers' tokens fills its own lane, and a
readiness probe waits for at most one question of each other lane, never behind the flood.
Within a lane the questions of each client (its address) take turns too, and a client may
have at most ``per_client`` waiting at once (``unknown_token_limit``, for tokens and for
metrics renderings): one address cannot spend the lane's share, and past its own bound it is
refused at once, unasked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from mservd.errors import MservdError

SPACING = 9.0  # a question's time, times this, passes before the next one starts
MAX_WAITING = 64  # different questions waiting at once in one lane; past it refused

K = TypeVar("K", bound=Hashable)  # a question, as its askers share it
T = TypeVar("T")  # its answer


class TooManyQuestions(MservdError):
    http_status = 503
    type = "ServiceUnavailableException"


class Lane(Generic[K]):
    """One kind of question: its questions by client, the clients taking turns."""

    def __init__(self, name: str, per_client: int | None) -> None:
        self.name = name
        self.per_client = per_client  # questions one client may have waiting; None: no bound
        self.clients: dict[Hashable, list[K]] = {}  # client -> its keys, oldest first
        self.count = 0  # keys waiting in all

    def add(self, client: Hashable, key: K) -> None:
        self.clients.setdefault(client, []).append(key)
        self.count += 1

    def waiting_of(self, client: Hashable) -> int:
        return len(self.clients.get(client, ()))

    def take(self) -> K:
        """The oldest key of the client whose turn it is; that client goes last."""
        client = next(iter(self.clients))
        keys = self.clients.pop(client)
        key = keys.pop(0)
        if keys:
            self.clients[client] = keys
        self.count -= 1
        return key


class SpacedQuestions(Generic[K, T]):
    def __init__(self, ask: Callable[[K], Awaitable[T]], what: str,
                 per_client: dict[str, int] | None = None) -> None:
        self.ask = ask  # the question for a key, put to the controller
        self.what = what  # what the questions are, for the refusal's message
        self.per_client = per_client or {}  # lane -> questions one client may have waiting
        self.waiting: dict[K, asyncio.Future[T]] = {}  # by key, any lane
        self.lanes: dict[str, Lane[K]] = {}  # those with questions waiting, in turn order
        self.next_start = 0.0  # loop time before which no question starts
        self._asker: asyncio.Task | None = None

    async def answer(self, key: K, lane: str = "", client: Hashable = None) -> T:
        """The answer to the next question ``key`` asked from now, in ``lane``, for
        ``client`` (an address; None: anyone's, not bounded per client)."""
        waiting = self.waiting.get(key)
        if waiting is None:
            queue = self._lane(lane)
            self._check_room(queue, lane, client)
            loop = asyncio.get_running_loop()
            waiting = self.waiting[key] = loop.create_future()
            queue.add(client, key)
            # its error is each asker's; retrieved here too, should every asker hang up
            waiting.add_done_callback(lambda done: done.cancelled() or done.exception())
            if self._asker is None:
                self._asker = loop.create_task(self._ask_in_turn())
        return await asyncio.shield(waiting)  # an asker that hangs up leaves it to the rest

    def _lane(self, name: str) -> Lane[K]:
        queue = self.lanes.get(name)
        if queue is None:
            queue = self.lanes[name] = Lane(name, self.per_client.get(name))
        return queue

    def _check_room(self, queue: Lane[K], lane: str, client: Hashable) -> None:
        if queue.count >= MAX_WAITING:
            raise TooManyQuestions(f"{MAX_WAITING} {self.what} ({lane or 'other'}) are waiting "
                                   "for the controller; retry later.", headers={"Retry-After": "1"})
        if (client is not None and queue.per_client is not None
                and queue.waiting_of(client) >= queue.per_client):
            raise TooManyQuestions(
                f"{queue.per_client} {lane or 'other'} questions from {client} are already "
                "waiting for the controller; retry once they are answered.",
                headers={"Retry-After": "1"})

    def _next_key(self) -> K:
        """The next question: the lanes take turns, and the clients within a lane."""
        name = next(iter(self.lanes))
        queue = self.lanes.pop(name)
        key = queue.take()
        if queue.count:
            self.lanes[name] = queue  # its next question waits for the other lanes'
        return key

    async def _ask_in_turn(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.lanes:
                await asyncio.sleep(max(0.0, self.next_start - loop.time()))
                key = self._next_key()
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
