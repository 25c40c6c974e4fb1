"""Load shedding at the edge: a frontend refuses the predictions it cannot answer in time,
as soon as they are parsed — a refusal there costs a small fraction of serving the request,
and nothing downstream (controller, workers) ever sees it.

Two rules:

- **a model's concurrency limit** (:class:`ModelLimit`), per model and per frontend process.
  What a fast model has in flight is never more than it answers within ``max_queue_wait_ms``
  at its best lately (its *capacity*): by Little's law that is a mean wait of the whole
  allowance. Once more arrive than it answers — what it has in flight keeps rising, or its
  answers come back later than the wait — and it already has half that in flight, the model is
  *limited*: to what it answers in a third of the wait, so the tail too stays inside it. While
  limited, the limit follows Little's share while answers are late and grows while they are on
  time; nothing refused for half a second lifts it. A closed loop (a fixed set of clients,
  each sending again at once) neither keeps rising nor, at a sane size, waits longer than the
  wait, so it is let be; if one is limited all the same its clients spin on refusals, far
  faster than any open arrival rate, and that lifts the limit for a second.
- **the event loop's lag** (:class:`Shedder`): under overload the queue that grows first may be
  the work waiting for this process's CPU (requests read late, answers relayed late), which
  shows as how much later than asked a short timer fires. While that lag is past
  ``shed_delay_ms`` with many predictions in flight (an idle process that merely lost the CPU to
  a neighbour has nothing to shed), predictions are refused.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable

from mservd.core.spinning import Spin
from mservd.errors import MservdError

TICK = 0.005  # seconds between lag samples, and between a model limit's moves
SMOOTHING = 0.1  # weight of the newest sample: one long turn (a burst) is not a backlog
MIN_BUSY = 16  # predictions in flight here before lag can mean they are what is waiting

RATE_TICKS = 200  # a model's rate: its answers per second over the last second it had work
RECENT_TICKS = 20  # its capacity and its refusals are counted over the last 0.1 s
RISE_TICKS = 2  # rising: up by RISE_STEP over each of the last RISE_SPANS spans of this many
RISE_STEP = 4  # ticks (10 ms): a steady excess of arrivals, not one burst of them
RISE_SPANS = 3
LATENCY_SMOOTHING = 0.05  # weight of one answer's latency in a model's mean
SERVICE_DRIFT = 0.01  # per second: how fast its quickest answer and its capacity are forgotten
CEILING = 1.0  # never more in flight than its capacity answers in this many waits
ENGAGE = 0.5  # limited only once it has this share of the ceiling in flight
SHARE = 3  # limited, it may have in flight what it answers in wait / SHARE ...
LIMIT_FLOOR = 8  # ... but never less than this many
RECOVER = 1.0  # on time while limited, the limit grows by e every this many seconds
LIFT = 0.5  # seconds with nothing refused: the limit is lifted
RESEND_RATIO = 2.0  # refused at this many times its capacity: clients resending at once ...
RESEND_PAUSE = 1.0  # ... and it is not limited for this many seconds
IDLE_FADE = 0.9  # per tick with nothing in flight: an idle model's lateness fades

INFINITE = float("inf")


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
    server counts ``busy`` around each prediction and ``refused`` at the door, reports each
    answer, and ticks it every TICK; the limit moves only on ticks, so the door's test is one
    comparison."""

    def __init__(self, wait: float) -> None:
        self.wait = wait  # seconds a request may queue: max_queue_wait_ms
        self.busy = 0  # in flight now
        self.refused = 0  # refused at the door since the last tick
        self.latency = 0.0  # seconds per answer, smoothed
        # its quickest answer, forgotten slowly: the model's speed without load, not its
        # latency under load (which would lift the limit just when it matters)
        self.quickest = INFINITE
        self.rate = 0.0  # answers per second while it had work, over the last RATE_TICKS
        self.capacity = 0.0  # answers per second at its best lately, forgotten slowly
        self.limited = INFINITE  # the limit while limited (see the module), else infinite
        self.allowed = INFINITE  # in flight allowed now: the limit, else the ceiling
        self._answers = 0  # since the last tick
        self._working: collections.deque[tuple[int, float]] = collections.deque()
        self._working_answers = 0  # the sums over _working
        self._working_seconds = 0.0
        self._recent: collections.deque[tuple[int, int, float]] = collections.deque(
            maxlen=RECENT_TICKS)  # answers, refusals, seconds
        self._busy: collections.deque[int] = collections.deque(
            maxlen=RISE_SPANS * RISE_TICKS + 1)
        self._quiet = 0.0  # seconds since the last refusal
        self._calm = 0.0  # seconds left in which it is not limited

    def full(self) -> bool:
        """Refuse the next one?"""
        return self.busy >= self.allowed

    def answered(self, seconds: float) -> None:
        self._answers += 1
        self.latency += LATENCY_SMOOTHING * (seconds - self.latency)
        self.quickest = min(self.quickest, seconds)

    def tick(self, seconds: float) -> None:
        if not self.busy and not self._answers:
            self.latency *= IDLE_FADE  # nothing waits: the next burst is not judged by the last
        else:  # its rate while it has work: idle time is no measure of it
            self._working.append((self._answers, seconds))
            self._working_answers += self._answers
            self._working_seconds += seconds
            if len(self._working) > RATE_TICKS:
                answers, old = self._working.popleft()
                self._working_answers -= answers
                self._working_seconds -= old
            self.rate = self._working_answers / self._working_seconds
        self._recent.append((self._answers, self.refused, seconds))
        forget = 1.0 - SERVICE_DRIFT * seconds
        self.capacity *= forget
        if len(self._recent) == RECENT_TICKS:  # a whole window: one burst is no measure
            answered = sum(a for a, _, _ in self._recent)
            self.capacity = max(self.capacity, answered / sum(t for _, _, t in self._recent))
        self.quickest /= forget
        self._busy.append(self.busy)
        self._quiet = 0.0 if self.refused else self._quiet + seconds
        self._calm = max(0.0, self._calm - seconds)
        self._answers = self.refused = 0
        self.limited = self._next_limit(seconds)
        # the ceiling holds once answers slow down: while they come quickly, the capacity seen
        # may be only what it was asked for, and a burst onto a quick model is let in
        slowing = self.capacity and self.latency > self.wait / SHARE
        ceiling = max(LIMIT_FLOOR, CEILING * self.capacity * self.wait) if slowing else INFINITE
        self.allowed = INFINITE if self._exempt() else min(self.limited, ceiling)

    def _exempt(self) -> bool:
        """A model whose quickest answer takes half the wait (a slow model) is not limited
        here: a refusal saves little next to its answer, and the controller bounds its queue
        in batch times. Nor is one whose refused clients spin (see the module)."""
        return self.quickest > self.wait / 2 or self._calm > 0

    def share(self) -> float:
        """Little's law: in flight at its rate for a mean latency of wait / SHARE."""
        return max(LIMIT_FLOOR, self.rate * self.wait / SHARE)

    def _next_limit(self, seconds: float) -> float:
        """Limited or not from here on, and to what (the rules in the module's order)."""
        if self._exempt():
            return INFINITE
        refusals = sum(r for _, r, _ in self._recent)
        if refusals > RESEND_RATIO * self.capacity * sum(t for _, _, t in self._recent):
            self._calm = RESEND_PAUSE
            return INFINITE
        if self.limited == INFINITE:
            busy = self._busy
            rising = len(busy) == busy.maxlen and all(
                busy[i + RISE_TICKS] - busy[i] >= RISE_STEP
                for i in range(0, busy.maxlen - 1, RISE_TICKS))
            late = self.latency > self.wait
            behind = self.capacity and self.busy > ENGAGE * self.capacity * self.wait
            return self.share() if behind and (rising or late) else INFINITE
        if self._quiet >= LIFT:
            return INFINITE
        if self.latency > self.wait / SHARE:
            return max(LIMIT_FLOOR, min(self.limited, self.share()))
        return self.limited * (1.0 + seconds / RECOVER)


# After the controller refuses a model's request as overloaded (503 with Retry-After, for a
# request without a deadline of its own), this process refuses that model's requests itself
# for this long: under overload most refusals then cost one parse here instead of a trip
# through the controller, which must keep up — unless its clients spin on the refusals
# (mservd/core/spinning.py): then it lets them through.
REFUSAL_HOLD = 0.02  # seconds
MAX_KEPT_BODIES = 256  # refusal bodies kept per process, by (path, limit)


def is_kserve_prediction(path: str) -> bool:
    """KServe v1 ``:predict``/``:explain``, v2 ``/infer`` and ``/generate[_stream]``: let in
    or refused at the door like ``/predictions``, and refused in KServe's ``{"error": ...}``
    shape."""
    return path.startswith(("/v1/models/", "/v2/models/")) and path.endswith(
        (":predict", ":explain", "/infer", "/generate", "/generate_stream"))


class Door:
    """One frontend process's door for predictions, by request path: each model's
    :class:`ModelLimit`, and the refusals the controller asked it to hold for a moment.

    A prediction asks :meth:`refusal` first (a body means answer 503 with it, at once), then
    :meth:`let_in` (counted against its model's limit until :meth:`answered`)."""

    def __init__(self, queue_wait: float) -> None:
        self.queue_wait = queue_wait  # seconds: max_queue_wait_ms
        self.limits: dict[str, ModelLimit] = {}  # by path, once its model has answered
        self.holding: dict[str, tuple[float, bytes]] = {}  # path -> (until, refusal body)
        self.spins: dict[str, Spin] = {}  # path -> its refusals against its answers, once
        # the controller has refused it
        self._bodies: dict[tuple[str, int], bytes] = {}

    def refusal(self, path: str) -> bytes | None:
        """The body of the 503 that refuses this prediction now, or None to let it in."""
        limit = self.limits.get(path)
        if limit is not None and limit.full():
            limit.refused += 1
            return self._refusal_body(path, int(limit.allowed))
        held = self.holding.get(path)
        if held is not None:
            now = time.monotonic()
            spin = self.spins[path]
            if now < held[0] and not spin.resting(now):
                spin.refusal(now)
                return held[1]
            del self.holding[path]
        return None

    def let_in(self, path: str) -> ModelLimit | None:
        limit = self.limits.get(path)
        if limit is not None:
            limit.busy += 1
        return limit

    def answered(self, path: str, limit: ModelLimit | None, status: int, seconds: float,
                 overloaded: bool, body: bytes) -> None:
        """A prediction let in is answered: it tells its model's limit how quickly it
        answers; the controller's refusal of it as overloaded (``overloaded``:
        ``gateway.refused_as_overload``) is held here a moment."""
        if limit is not None:
            limit.busy -= 1
        spin = self.spins.get(path)
        if status < 300:
            if spin is not None:
                spin.answers(1, time.monotonic())
            if self.queue_wait:
                if limit is None:  # known once it answers: a client's typo makes no entry
                    limit = self.limits.setdefault(path, ModelLimit(self.queue_wait))
                limit.answered(seconds)
        elif overloaded:
            now = time.monotonic()
            if spin is None:
                spin = self.spins[path] = Spin()
            spin.refusal(now)
            if not spin.resting(now):
                self.holding[path] = (now + REFUSAL_HOLD, body)

    def tick(self, seconds: float, log) -> None:
        for path, limit in self.limits.items():
            was = limit.limited
            limit.tick(seconds)
            if (was == INFINITE) != (limit.limited == INFINITE):
                if was == INFINITE:
                    log.info("%s limited to %d in flight from this frontend: more arrive than "
                             "it answers within max_queue_wait_ms", path, limit.limited)
                else:
                    log.info("%s no longer limited", path)

    def _refusal_body(self, path: str, limit: int) -> bytes:
        body = self._bodies.get((path, limit))
        if body is None:
            if len(self._bodies) > MAX_KEPT_BODIES:
                self._bodies.clear()
            refused = Overloaded(
                f"Requested model is overloaded: {limit} of its predictions are in flight from "
                "this frontend, as many as it answers in time at its pace (max_queue_wait_ms is "
                f"{self.queue_wait * 1000:.0f} ms); retry later.")
            body = self._bodies[(path, limit)] = (
                json.dumps({"error": refused.message}).encode()  # KServe's error shape
                if is_kserve_prediction(path) else refused.to_body())
        return body
