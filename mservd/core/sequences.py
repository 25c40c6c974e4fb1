"""The queue of a stateful model version: TorchServe's sequence batching.

A stateful handler keeps each sequence's state (an LSTM's hidden state, a conversation) in its
worker's memory, keyed by ``context.get_sequence_id(idx)``. So the requests of one sequence
must run on one worker, in the order they came, one at a time; a batch takes at most one
request from each sequence. This queue holds each sequence's requests apart and hands each
idle worker the next request of every sequence pinned to it.

Pure and clock-free like :class:`~mservd.core.batcher.Batcher`, whose interface the scheduler
uses for every version (length, expiry, removal, draining); the sequence-only parts are
:meth:`SequenceQueue.add_to_sequence`, :meth:`SequenceQueue.take_for`,
:meth:`SequenceQueue.finished` and :meth:`SequenceQueue.worker_lost`.

As in TorchServe:

* a request names its sequence in the ``ts_request_sequence_id`` header; one without gets a
  new id, ``ts-seq-<uuid4>``, and ``ts_request_sequence_start: true``, both shown to the
  handler as request headers (and the id sent back as a response header, so that the client
  can go on with it);
* at most ``maxNumSequence`` sequences are open, each queueing at most
  ``maxSequenceJobQueueSize`` requests; past either the request is refused 503;
* a sequence closes when it has had nothing queued or running for ``sequenceMaxIdleMSec``
  (over 0, else the model is not stateful: ``config.py``), when ``sequenceTimeoutMSec`` has
  passed since it opened and it has nothing, or when its request sent with
  ``ts_request_sequence_end: true`` is answered and nothing is queued behind it; a request for
  a closed or unknown id opens it again;
* with ``continuousBatching`` too (TorchServe's SequenceContinuousBatching), a worker runs its
  sequences' requests in free slots between steps, a sequence's next request joining while
  the one before it still streams (so that a client can, say, cancel it), and the handler
  may end sequences itself: ``ts_request_sequence_end`` in an answer's headers names them
  (``;`` between ids), and each closes once nothing of it is queued or running;
* a sequence is its opener's (beyond TorchServe, which lets any holder of the inference key go
  on with any id): it takes requests only from the client that opened it, the client's
  address as its frontend saw it (an IPv4 address, an IPv6 /64), and one client holds at most
  ``max_sequences_per_client`` sequences of a version (by default half its maxNumSequence),
  so one client cannot fill ``maxNumSequence`` for everyone; the ``ts_request_sequence_start``
  header is the server's alone (``protocol.Request.handler_headers`` drops a client's own). A
  request whose frontend did not say who sent it opens a sequence that anyone may go on with,
  and counts against no client;
* each worker holds up to its share of ``maxNumSequence`` (rounded up; which is at least
  ``batchSize`` × ``maxWorkers``, ``config.py``): a new sequence goes to the first idle worker
  with room (new ones waiting together are shared out), and stays there. A worker that dies
  or is stopped leaves its sequences to the others (the handler's state for them is lost
  with it); a sequence still running on a stopping worker moves only once it is done there.
"""

from __future__ import annotations

import heapq
import uuid
from collections import Counter, deque
from collections.abc import Callable, Collection
from typing import Generic, Protocol, TypeVar

from mservd.errors import MservdError, SequenceRefused
from mservd.protocol import SEQUENCE_END, SEQUENCE_ID, SEQUENCE_START


class Sequenced(Protocol):
    arrived: float
    deadline: float
    kind: int
    sequence: str | None
    ends_sequence: bool
    server_headers: dict[str, str] | None
    client: str | None  # who sent it (its address), None where its frontend did not say


class SequenceForbidden(MservdError):
    """A request names a sequence another client opened: a sequence id is no bearer token that
    any holder of the (shared) inference key may use."""

    http_status = 403
    type = "ForbiddenException"


T = TypeVar("T", bound=Sequenced)


def ended_by(headers: object) -> list[str]:
    """The sequences a handler ended in an answer's headers: ``ts_request_sequence_end``
    (any case), their ids separated by ``;``, as TorchServe reads it."""
    if not isinstance(headers, dict):
        return []
    for name, value in headers.items():
        if isinstance(name, str) and name.lower() == SEQUENCE_END:
            return [part.strip() for part in str(value).split(";") if part.strip()]
    return []


class Sequence(Generic[T]):
    """One open sequence: its queued requests and the worker it is pinned to."""

    __slots__ = ("ending", "id", "idle_since", "opened", "owner", "queue", "running", "worker")

    def __init__(self, sequence_id: str, now: float, owner: str | None) -> None:
        self.id = sequence_id
        self.owner = owner  # the client that opened it (None: unknown, anyone may go on)
        self.queue: deque[T] = deque()
        self.worker: str | None = None  # the worker its handler state lives in
        self.running = 0  # its requests in a worker now (more than one only continuously)
        self.opened = now
        self.idle_since = now  # when it last had nothing queued or running
        self.ending = False  # ended (by its handler, or a client while others of it ran):
        # it closes once nothing of it is left


class SequenceQueue(Generic[T]):
    """The sequences, indexed so that what a request costs does not grow with how many are
    open (up to ``maxNumSequence``, which may be large): the batches, waits and deadlines look
    only at the sequences with requests queued (``_pending``, bounded by job_queue_size),
    closing looks only at the idle ones in the order they went idle (``_idle``) and at a heap
    of lifetimes, and each worker's counts are kept as they change."""

    def __init__(self, what: str, batch_size: int, max_batch_delay: float, capacity: int,
                 max_sequences: int, sequence_capacity: int, max_idle: float,
                 lifetime: float) -> None:
        """``what`` names the version in refusals ("Model m version 1.0"); times in seconds
        (``lifetime`` 0: none); ``capacity`` bounds all requests queued (job_queue_size)."""
        self.what = what
        self.batch_size = max(1, batch_size)
        self.max_batch_delay = max(0.0, max_batch_delay)
        self.capacity = max(1, capacity)
        self.max_sequences = max(1, max_sequences)
        self.sequence_capacity = max(1, sequence_capacity)
        self.max_idle = max(0.0, max_idle)
        self.lifetime = max(0.0, lifetime)
        self._sequences: dict[str, Sequence[T]] = {}  # every open one
        self._pending: dict[str, Sequence[T]] = {}  # those with requests queued
        self._idle: dict[str, Sequence[T]] = {}  # nothing queued or running, oldest first
        self._ends: list[tuple[float, str]] = []  # heap: when each one's lifetime ends
        self._held: Counter[str] = Counter()  # by worker: the sequences pinned to it ...
        self._idle_on: Counter[str] = Counter()  # ... and of those, the idle ones
        self._by_client: Counter[str] = Counter()  # the open sequences each client opened
        self._questions: deque[T] = deque()  # describe calls' questions: in no sequence
        self._queued = 0
        self._clock = 0.0  # the latest time a caller gave: for a removal that gives none

    def __len__(self) -> int:
        return self._queued

    @property
    def remaining_capacity(self) -> int:
        return self.capacity - self._queued

    def held(self, worker: str) -> int:
        """The open sequences pinned to ``worker``."""
        return self._held[worker]

    def is_open(self, sequence: str) -> bool:
        """Whether ``sequence`` is one of this version's: a split model's requests that go on
        with a sequence go to the version that opened it (core/traffic.py)."""
        return sequence in self._sequences

    def open_count(self, now: float) -> int:
        """Sequences open now (the closed ones are forgotten on the way)."""
        self._close_expired(now)
        return len(self._sequences)

    # -- arriving -----------------------------------------------------------------------

    def add(self, item: T) -> bool:
        """A describe call's question to the handler: in no sequence, it runs alone on the
        next idle worker."""
        if self._queued >= self.capacity:
            return False
        self._questions.append(item)
        self._queued += 1
        return True

    def add_to_sequence(self, item: T, now: float, per_client: int = 0) -> bool:
        """Queue ``item`` in its sequence, opening it if need be; False when the version's
        whole queue is full (job_queue_size). Raises SequenceRefused past maxNumSequence,
        past ``per_client`` sequences of its client (0: half of maxNumSequence) or past the
        sequence's own queue, and SequenceForbidden for another client's sequence."""
        if self._queued >= self.capacity:
            return False
        self._clock = max(self._clock, now)
        headers = {}
        if item.sequence is None:
            item.sequence = f"ts-seq-{uuid.uuid4()}"
            headers[SEQUENCE_START] = "true"
        sequence = self._sequences.get(item.sequence)
        if sequence is not None and self._expired(sequence, now):
            self._close(sequence)
            sequence = None
        if sequence is None:
            if len(self._sequences) >= self.max_sequences:
                self._close_expired(now)
            if len(self._sequences) >= self.max_sequences:
                raise SequenceRefused(
                    f"{self.what} has {len(self._sequences)} sequences open, as many as it "
                    f"allows (maxNumSequence); sequence {item.sequence} cannot start. Retry "
                    "when one ends (ts_request_sequence_end) or has been idle for "
                    "sequenceMaxIdleMSec.")
            self._check_client_room(item.client, per_client, now)
            sequence = self._open(item.sequence, now, item.client)
        elif sequence.owner is not None and sequence.owner != item.client:
            raise SequenceForbidden(
                f"Sequence {sequence.id} of {self.what[0].lower()}{self.what[1:]} was opened "
                "by another client, and takes requests only from it. Send a request without "
                "ts_request_sequence_id to open a sequence of your own.")
        if len(sequence.queue) >= self.sequence_capacity:
            raise SequenceRefused(
                f"Sequence {sequence.id} of {self.what[0].lower()}{self.what[1:]} has "
                f"{len(sequence.queue)} requests "
                "queued, as many as it allows (maxSequenceJobQueueSize); send the next one "
                "when an answer comes.")
        headers[SEQUENCE_ID] = sequence.id
        item.server_headers = headers
        self._queue(sequence, item)
        return True

    def push_front(self, item: T) -> None:
        """Put back a request whose worker died, first in its sequence (or, a describe
        call's question, first of the questions) and past the bounds."""
        if item.sequence is None:
            self._questions.appendleft(item)
            self._queued += 1
            return
        sequence = self._sequences.get(item.sequence)
        if sequence is None:
            sequence = self._open(item.sequence, item.arrived, item.client)
        self._queue(sequence, item, first=True)

    # -- batches ------------------------------------------------------------------------

    def take_for(self, worker: str, live: Collection[str], now: float,
                 slots: int | None = None) -> list[T]:
        """The batch idle ``worker`` should run now: the next request of each sequence pinned
        to it, then of sequences that no live worker holds (up to its share of
        maxNumSequence among ``live``, the serving workers' ids, and of those waiting now its
        part among them), at most ``batch_size``, all of one kind. ``[]`` to keep waiting:
        while fewer are ready than the batch holds and other sequences of this worker may
        send soon, up to ``max_batch_delay`` from the oldest's arrival.

        ``slots``: the worker batches continuously (TorchServe's SequenceContinuousBatching)
        and has that many free. Then a sequence's next request joins while the one before it
        still runs (a client may cancel a stream it is reading), the take is at most
        ``slots`` and never waits."""
        if self._questions:
            self._queued -= 1
            return [self._questions.popleft()]
        self._clock = max(self._clock, now)
        self._close_expired(now)  # a closed sequence holds no room on its worker
        share = -(-self.max_sequences // max(1, len(live)))
        ready: list[Sequence[T]] = []
        free: list[Sequence[T]] = []
        for sequence in self._pending.values():
            if sequence.running and slots is None:
                continue
            if sequence.worker == worker:
                ready.append(sequence)
            elif not sequence.running and (sequence.worker is None or sequence.worker not in live):
                free.append(sequence)  # (one still running on a stopping worker stays there)
        room = max(0, share - self._held[worker])
        if len(free) > 1 and len(live) > 1:  # the new sequences shared out among the workers,
            # as TorchServe's aggregators poll them: one, and a worker's part of the rest
            room = min(room, 1 + max(1, (len(free) - 1) // len(live)))
        ready += free[:room]
        if not ready:
            return []
        ready.sort(key=lambda s: s.queue[0].arrived)
        waiting = self._idle_on[worker] > 0  # its idle sequences may send soon
        if (slots is None and waiting and len(ready) < self.batch_size
                and now < ready[0].queue[0].arrived + self.max_batch_delay):
            return []
        kind = ready[0].queue[0].kind
        most = self.batch_size if slots is None else slots
        taken: list[T] = []
        for sequence in ready:
            if len(taken) >= most:
                break
            if sequence.queue[0].kind != kind:
                continue
            taken.append(sequence.queue.popleft())
            sequence.running += 1
            self._pin(sequence, worker)
            if not sequence.queue:
                del self._pending[sequence.id]
        self._queued -= len(taken)
        return taken

    def finished(self, items: Collection[T], now: float) -> None:
        """``items`` left their worker (answered or failed): their sequences may send the
        next request; one with nothing left queued or running closes if it was ended (by
        the request's header or its handler), else starts its idle time."""
        self._clock = max(self._clock, now)
        for item in items:
            sequence = self._sequences.get(item.sequence) if item.sequence else None
            if sequence is None:  # a question, or a sequence closed meanwhile
                continue
            sequence.running = max(0, sequence.running - 1)
            if item.ends_sequence and sequence.running:  # others of it still run (streams):
                sequence.ending = True  # it ends once they are done
            if not sequence.queue and not sequence.running:
                self._rest(sequence, now, ends=item.ends_sequence or sequence.ending)

    def end(self, sequence_ids: Collection[str], now: float) -> None:
        """The handler ended these sequences (``ts_request_sequence_end`` in its answer's
        headers, TorchServe's SequenceContinuousBatching): each closes once nothing of it is
        queued or running (at once if nothing is)."""
        self._clock = max(self._clock, now)
        for sequence_id in sequence_ids:
            sequence = self._sequences.get(sequence_id)
            if sequence is None:
                continue
            sequence.ending = True
            if not sequence.queue and not sequence.running:
                self._close(sequence)

    def worker_lost(self, worker: str) -> None:
        """``worker`` is gone: its sequences go to the next idle worker with room. (Its
        running requests come back through :meth:`push_front` or :meth:`finished`.)"""
        for sequence in self._sequences.values():
            if sequence.worker == worker:
                sequence.worker = None
                sequence.running = 0
        self._held.pop(worker, None)
        self._idle_on.pop(worker, None)

    # -- the Batcher interface the scheduler uses for every version ---------------------

    def oldest_wait(self, now: float) -> float:
        heads = [s.queue[0].arrived for s in self._pending.values()]
        if self._questions:
            heads.append(self._questions[0].arrived)
        return now - min(heads) if heads else 0.0

    def expire(self, now: float) -> list[T]:
        """Take out the queued requests whose deadline has passed."""
        if not self._queued:
            return []
        return self.remove(lambda item: item.deadline <= now, now)

    def remove(self, predicate: Callable[[T], bool], now: float | None = None) -> list[T]:
        """Take out the queued requests ``predicate`` selects (a cancelled one, a deadline);
        a sequence left with nothing starts its idle time (at ``now``, or the latest time
        given before)."""
        if now is not None:
            self._clock = max(self._clock, now)
        removed = [item for item in self._questions if predicate(item)]
        if removed:
            self._questions = deque(item for item in self._questions if not predicate(item))
        for sequence in list(self._pending.values()):
            if not any(predicate(item) for item in sequence.queue):
                continue
            kept: deque[T] = deque()
            for item in sequence.queue:
                (removed if predicate(item) else kept).append(item)
            sequence.queue = kept
            if not kept:
                del self._pending[sequence.id]
                if not sequence.running:
                    self._rest(sequence, self._clock, ends=sequence.ending)
        self._queued -= len(removed)
        return removed

    def drain(self) -> list[T]:
        items = [*self._questions, *(item for s in self._pending.values() for item in s.queue)]
        for index in (self._sequences, self._pending, self._idle, self._held, self._idle_on,
                      self._by_client, self._questions):
            index.clear()
        self._ends = []
        self._queued = 0
        return items

    def next_wakeup(self, now: float) -> float | None:
        """When :meth:`take_for` or :meth:`expire` may next have something to do: the soonest
        deadline, or the end of a batch delay still to come (never a time past: a request
        waiting on its busy worker is taken when that worker answers)."""
        soonest = min((item.deadline for item in self._questions), default=None)
        for sequence in self._pending.values():
            for item in sequence.queue:
                if soonest is None or item.deadline < soonest:
                    soonest = item.deadline
            if self.max_batch_delay:
                due = sequence.queue[0].arrived + self.max_batch_delay
                if due > now and (soonest is None or due < soonest):
                    soonest = due
        return soonest

    # -- the indexes --------------------------------------------------------------------

    def _check_client_room(self, client: str | None, per_client: int, now: float) -> None:
        """Raise SequenceRefused if ``client`` holds as many open sequences as one client may:
        ``per_client``, or by default half of maxNumSequence (rounded up), so that the
        sequences one client opens (one per request that names none) cannot fill the version
        for every other client."""
        if client is None:
            return
        most = per_client or -(-self.max_sequences // 2)
        if self._by_client[client] >= most:
            self._close_expired(now)
        if self._by_client[client] >= most:
            raise SequenceRefused(
                f"{self.what} has {self._by_client[client]} sequences open for client "
                f"{client}, as many as one client may hold (max_sequences_per_client: "
                f"{most}); end one (ts_request_sequence_end) or let one idle for "
                "sequenceMaxIdleMSec before opening another.")

    def _open(self, sequence_id: str, now: float, owner: str | None) -> Sequence[T]:
        sequence = self._sequences[sequence_id] = Sequence(sequence_id, now, owner)
        if owner is not None:
            self._by_client[owner] += 1
        if self.lifetime:
            heapq.heappush(self._ends, (now + self.lifetime, sequence_id))
            if len(self._ends) > 2 * len(self._sequences) + 64:  # closed ones' ends, mostly:
                # rebuilt from the open ones, so that opening and ending sequences quickly
                # cannot grow the heap for a whole lifetime
                self._ends = [(s.opened + self.lifetime, s.id) for s in self._sequences.values()]
                heapq.heapify(self._ends)
        return sequence

    def _queue(self, sequence: Sequence[T], item: T, first: bool = False) -> None:
        self._wake(sequence)
        if first:
            sequence.queue.appendleft(item)
        else:
            sequence.queue.append(item)
        self._pending[sequence.id] = sequence
        self._queued += 1

    def _pin(self, sequence: Sequence[T], worker: str) -> None:
        if sequence.worker != worker:
            if sequence.worker is not None:
                self._held[sequence.worker] -= 1
            self._held[worker] += 1
            sequence.worker = worker

    def _rest(self, sequence: Sequence[T], now: float, ends: bool = False) -> None:
        """Nothing of ``sequence`` is queued or running: it idles, or closes now."""
        self._wake(sequence)
        sequence.idle_since = now
        if ends or self._expired(sequence, now):
            self._close(sequence)
            return
        self._idle[sequence.id] = sequence
        if sequence.worker is not None:
            self._idle_on[sequence.worker] += 1

    def _wake(self, sequence: Sequence[T]) -> None:
        if self._idle.pop(sequence.id, None) is not None and sequence.worker is not None:
            self._idle_on[sequence.worker] -= 1

    def _close(self, sequence: Sequence[T]) -> None:
        self._wake(sequence)
        del self._sequences[sequence.id]
        self._pending.pop(sequence.id, None)
        if sequence.worker is not None:
            self._held[sequence.worker] -= 1
        if sequence.owner is not None:
            self._by_client[sequence.owner] -= 1
            if not self._by_client[sequence.owner]:  # a client's count goes with its last one
                del self._by_client[sequence.owner]

    # -- closing ------------------------------------------------------------------------

    def _expired(self, sequence: Sequence[T], now: float) -> bool:
        if sequence.running or sequence.queue:
            return False
        return (now - sequence.idle_since >= self.max_idle
                or (self.lifetime > 0 and now - sequence.opened >= self.lifetime))

    def _close_expired(self, now: float) -> None:
        """The idle sequences past their idle time (the oldest idle first: they went idle in
        that order) or their lifetime (a busy one closes when it is next idle)."""
        while self._idle:
            sequence = next(iter(self._idle.values()))
            if now - sequence.idle_since < self.max_idle:
                break
            self._close(sequence)
        while self._ends and self._ends[0][0] <= now:
            _, sequence_id = heapq.heappop(self._ends)
            ending = self._idle.get(sequence_id)
            if ending is not None and now - ending.opened >= self.lifetime:
                self._close(ending)
