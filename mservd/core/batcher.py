"""The bounded queue and dynamic batching policy of one model version.

Pure and clock-free: callers pass ``now``; nothing here polls, sleeps, or knows about ZeroMQ.

The policy keeps a lone request fast and a loaded server efficient:

* a batch is handed to an idle worker at once when it is full, or when no worker of the
  version is busy (waiting for batch-mates would only add latency to an idle server);
* while some worker is busy, an idle worker waits up to ``max_batch_delay`` from the oldest
  request's arrival for the batch to fill;
* a batch is all predictions or all explanations (``kind``), never a mix: a handler decides
  how to run a whole batch; a describe call's question to the handler runs alone, as
  TorchServe runs it (the handler answers it with one document);
* requests whose deadline passes in the queue are taken out by ``expire`` to be answered 504,
  never computed;
* ``oldest_wait`` lets the controller refuse new requests while the queue is standing still
  (the head has waited too long), so overload is refused at once instead of queued.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Protocol, TypeVar

from mservd.protocol import DESCRIPTION


class Queued(Protocol):
    arrived: float
    deadline: float
    kind: int  # what it asks of the handler: protocol.PREDICTION, EXPLANATION or DESCRIPTION


T = TypeVar("T", bound=Queued)


class Batcher(Generic[T]):
    def __init__(self, batch_size: int, max_batch_delay: float, capacity: int) -> None:
        """``max_batch_delay`` in seconds; ``capacity`` bounds the queue (``job_queue_size``)."""
        self.batch_size = max(1, batch_size)
        self.max_batch_delay = max(0.0, max_batch_delay)
        self.capacity = max(1, capacity)
        self._queue: deque[T] = deque()
        self._soonest: float | None = float("inf")  # None: recompute on next read

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def remaining_capacity(self) -> int:
        return self.capacity - len(self._queue)

    def add(self, item: T) -> bool:
        """Queue ``item``; False when the queue is full (the caller answers 503)."""
        if len(self._queue) >= self.capacity:
            return False
        self._queue.append(item)
        if self._soonest is not None and item.deadline < self._soonest:
            self._soonest = item.deadline
        return True

    def oldest_wait(self, now: float) -> float:
        """How long the request at the head of the queue has waited (0 when empty)."""
        return now - self._queue[0].arrived if self._queue else 0.0

    def push_front(self, item: T) -> None:
        """Put back a request whose worker died, ahead of the others and past the bound."""
        self._queue.appendleft(item)
        self._soonest = None

    def take(self, now: float, any_busy: bool, limit: int | None = None,
             share: int | None = None) -> list[T]:
        """The batch one idle worker should run now, or ``[]`` to keep waiting; at most
        ``limit`` requests (a continuous-batching worker's free slots). ``share`` caps the
        batch taken, not the one waited for: the worker's share of what the version holds."""
        queue = self._queue
        if not queue:
            return []
        size = self.batch_size if limit is None else max(0, min(limit, self.batch_size))
        if len(queue) < size and any_busy and now < queue[0].arrived + self.max_batch_delay:
            return []
        if share is not None:
            size = max(1, min(size, share))
        self._soonest = None
        if not any(item.kind for item in queue):  # predictions only: the common case
            return [queue.popleft() for _ in range(min(size, len(queue)))]
        # the head's kind, in queue order, from anywhere in the queue; the rest keep their order
        kind = queue[0].kind
        if kind == DESCRIPTION:
            size = 1
        taken: list[T] = []
        kept: deque[T] = deque()
        for item in queue:
            if item.kind == kind and len(taken) < size:
                taken.append(item)
            else:
                kept.append(item)
        self._queue = kept
        return taken

    def expire(self, now: float) -> list[T]:
        """Take out the queued requests whose deadline has passed (each may have its own)."""
        if now < self._soonest_deadline():
            return []
        expired = [item for item in self._queue if item.deadline <= now]
        self._queue = deque(item for item in self._queue if item.deadline > now)
        self._soonest = None
        return expired

    def _soonest_deadline(self) -> float:
        if self._soonest is None:
            self._soonest = min((item.deadline for item in self._queue), default=float("inf"))
        return self._soonest

    def remove(self, predicate) -> list[T]:
        """Take out the requests ``predicate`` selects (a stopped model, a lost frontend)."""
        removed = [item for item in self._queue if predicate(item)]
        self._soonest = None
        if removed:
            self._queue = deque(item for item in self._queue if not predicate(item))
        return removed

    def drain(self) -> list[T]:
        items = list(self._queue)
        self._queue.clear()
        self._soonest = float("inf")
        return items

    def next_wakeup(self, any_busy: bool, any_idle: bool = True) -> float | None:
        """When ``take`` or ``expire`` may next have something to do, or None. With no worker
        idle (``any_idle`` False) only a deadline can be due: a batch waits for a worker's
        answer, which wakes the loop itself."""
        if not self._queue:
            return None
        soonest = self._soonest_deadline()
        if any_idle and any_busy and len(self._queue) < self.batch_size:
            soonest = min(soonest, self._queue[0].arrived + self.max_batch_delay)
        return soonest
