"""Load shedding at the edge: a frontend refuses the predictions it cannot answer in time,
as soon as they are parsed — a refusal there costs a small fraction of serving the request,
and nothing downstream (controller, workers) ever sees it.

Two rules:

- **a model's concurrency limit** (:class:`ModelLimit`): once a model's answers come back later
  than ``max_queue_wait_ms``, it may have only as many predictions in flight from this process
  as it answers here in a third of that time. By Little's law that puts their mean latency at
  a third of the wait, so even the slow tail (two to three times the mean) stays inside it.
  The rate is measured from the answers, so the limit follows the model's real speed. A model
  late only for a moment keeps what it has in flight (see :meth:`ModelLimit.allowed`). Once
  the answers are on time again the limit grows (about 2.7 times a second) until, at four
  times the share, it is lifted: a model that answers on time is not limited, so a burst onto
  an idle model is let in.
- **the event loop's lag** (:class:`Shedder`): under overload the queue that grows first may be
  the work waiting for this process's CPU (requests read late, answers relayed late), which
  shows as how much later than asked a short timer fires. While that lag is past
  ``shed_delay_ms`` with many predictions in flight (an idle process that merely lost the CPU to
  a neighbour has nothing to shed), predictions are refused.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from mservd.errors import MservdError

TICK = 0.005  # seconds between lag samples
SMOOTHING = 0.1  # weight of the newest sample: one long turn (a burst) is not a backlog
MIN_BUSY = 16  # predictions in flight here before lag can mean they are what is waiting
RATE_TICKS = 20  # a model's rate is its answers over the last this many ticks (0.1 s)
LATENCY_SMOOTHING = 0.05  # weight of one answer's latency in a model's mean
FLOOR = 8  # a model's limit never goes below this many in flight per process
SERVICE_DRIFT = 0.01  # per second: how fast a model's quickest answer is forgotten
SHARE = 3  # while late, a model may have in flight what it answers in wait / SHARE ...
SUSTAIN = 0.25  # ... once late this many seconds on end; before that, what it had in flight
RECOVER = 1.0  # once on time, a model's limit grows by e every RECOVER seconds ...
UNLIMITED = 4.0  # ... until it is this many times its share: then it has none
IDLE_FADE = 0.9  # per tick with nothing in flight: an idle model's lateness fades


class Overloaded(MservdError):
    http_status = 503
    type = "ServiceUnavailableException"


class Shedder:
    def __init__(self, limit_ms: float, loop: asyncio.AbstractEventLoop,
                 on_tick: Callable[[float], None] | None = None) -> None:
        self.limit = limit_ms / 1000.0
        self.lag = 0.0
        self.loop = loop
        self.on_tick = on_tick  # called with the seconds since the last tick
        self._asked = 0.0
        self.busy = 0  # predictions this process has sent and not yet answered
        if self.limit or on_tick:
            self._sample()

    def check(self) -> None:
        """Raise :class:`Overloaded` while the lag is past the limit (never with limit 0)."""
        if self.limit and self.lag > self.limit and self.busy >= MIN_BUSY:
            raise Overloaded(
                f"The server is overloaded: this frontend is {self.lag * 1000:.0f} ms behind "
                f"(shed_delay_ms is {self.limit * 1000:.0f}); retry later.",
                headers={"Retry-After": "1"})

    def _sample(self) -> None:
        now = time.perf_counter()
        if self._asked:
            late = max(0.0, now - self._asked - TICK)
            self.lag += SMOOTHING * (late - self.lag)
            if self.on_tick is not None:
                self.on_tick(now - self._asked)
        self._asked = now
        self.loop.call_later(TICK, self._sample)


class ModelLimit:
    """How many predictions of one model this process lets in at once (see the module). The
    server counts ``busy`` around each prediction, reports each answer, and ticks it."""

    def __init__(self, wait: float) -> None:
        self.wait = wait  # seconds a request may queue: max_queue_wait_ms
        self.busy = 0  # in flight now
        self.rate = 0.0  # answers per second over the last RATE_TICKS ticks
        self._ticks: collections.deque[tuple[int, float]] = collections.deque(maxlen=RATE_TICKS)
        self._answers = 0  # since the last tick
        self.latency = 0.0  # seconds per answer, smoothed
        # its quickest answer, forgotten slowly: the model's speed without load, not its
        # latency under load (which would lift the limit just when it matters)
        self.quickest = float("inf")
        self.limit = float("inf")  # in flight allowed; none while the answers are on time
        self._late_since: float | None = None  # late on end since then
        self._changed = 0.0  # when the limit last moved

    def allowed(self, now: float) -> float:
        """In flight allowed now (see the module). A model whose quickest answer takes half the
        wait (a slow model) has no limit here: a refusal saves little next to its answer, and
        the controller bounds its queue in batch times.

        When the answers turn late the limit first holds what is in flight: a closed loop (a
        fixed set of clients, each sending again at once, even after a refusal) that was late
        for a moment is not cut, which would only make its clients spin on refusals. Late for
        SUSTAIN seconds on end, it is cut to Little's share of the wait."""
        if self.quickest > self.wait / 2:
            return float("inf")
        share = max(FLOOR, self.rate * self.wait / SHARE)
        if self.latency > self.wait:
            if self._late_since is None:
                self._late_since = now
                self.limit = min(self.limit, max(self.busy, share))
            elif now - self._late_since >= SUSTAIN:
                self.limit = share
            self._changed = now
        elif self.limit != float("inf"):
            self._late_since = None
            self.limit *= 1.0 + (now - self._changed) / RECOVER
            self._changed = now
            if self.limit >= UNLIMITED * share:
                self.limit = float("inf")
        return self.limit

    def full(self, now: float) -> bool:
        """Refuse the next one? Only while the model's answers come back late, or lately."""
        return self.busy >= self.allowed(now)

    def answered(self, seconds: float) -> None:
        self._answers += 1
        self.latency += LATENCY_SMOOTHING * (seconds - self.latency)
        self.quickest = min(self.quickest, seconds)

    def tick(self, seconds: float) -> None:
        if not self.busy and not self._answers:
            self.latency *= IDLE_FADE  # nothing waits: the next burst is not judged by the last
        self._ticks.append((self._answers, seconds))
        self._answers = 0
        self.rate = sum(n for n, _ in self._ticks) / sum(t for _, t in self._ticks)
        self.quickest *= 1.0 + SERVICE_DRIFT * seconds
