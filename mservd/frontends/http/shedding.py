"""Load shedding at the edge: while this frontend process is behind, new predictions get 503.

Under overload the queue that grows first is not the model's (the controller bounds that one)
but the work waiting for this process's CPU: requests read late, answers relayed late. Its
length shows as the event loop's lag — how much later than asked a short timer fires. While the
lag is past ``shed_delay_ms`` with many predictions in flight (an idle process that merely lost
the CPU to a neighbour for a moment has nothing to shed), a prediction is refused as soon as it
is parsed, which costs a
small fraction of serving it, so the process catches up and the requests it takes are answered
in time instead of every request waiting seconds.
"""

from __future__ import annotations

import asyncio
import time

from mservd.errors import MservdError

TICK = 0.005  # seconds between lag samples
SMOOTHING = 0.1  # weight of the newest sample: one long turn (a burst) is not a backlog
MIN_BUSY = 16  # predictions in flight here before lag can mean they are what is waiting


class Overloaded(MservdError):
    http_status = 503
    type = "ServiceUnavailableException"


class Shedder:
    def __init__(self, limit_ms: float, loop: asyncio.AbstractEventLoop) -> None:
        self.limit = limit_ms / 1000.0
        self.lag = 0.0
        self.loop = loop
        self._asked = 0.0
        self.busy = 0  # predictions this process has sent and not yet answered
        if self.limit:
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
        self._asked = now
        self.loop.call_later(TICK, self._sample)
