"""Lending an idle worker to a frontend, so that a lone request passes no third process.

At low load the controller's hop is most of a request's latency: the frontend's message wakes
it, it queues the request, finds the idle worker at once and sends the batch on. When a
version's workers are all idle and its queue is empty, the controller therefore *lends* the
worker that just finished to the frontend whose request it answered (LEASE): that frontend
sends the next requests it reads for the version straight to the worker's job socket as a BATCH
(up to a batch at a time, one batch in flight), the worker answers the frontend directly and
tells the controller afterwards (SERVED), for its counts. The lease stands until the controller
needs the worker for a batch of its own (it picks an idle worker not lent first) or the worker
goes (REVOKE, lost: the frontend sends what it had sent there through the controller again).
Taking a lease back is a *recall*: REVOKE to the frontend, RECALL to the worker, which runs the
leased batches it holds, reports them and answers RETURNED; only then does the controller send
it a batch. Until then its requests wait in its queue, where their deadlines hold: the
controller never queues work behind a leased batch it cannot see.

Leases are for a lone client, not for load: a version lends only after ``LONE_BATCHES`` batches
in a row of one request each, and a version whose recalled worker had run leased batches lends
nothing for ``QUIET_AFTER_RECALL`` seconds (a new lease would only be recalled again). A recall
of a lease not yet used costs nothing more: a frontend's next request may overtake its lease,
which the worker's direct answer outruns. An open loop at 0.9x of tiny's capacity refused
1.4 % of its requests with leases granted at every idle moment against 0.1 % without (4
rounds).

Under token authorization the lease carries the inference key's SHA-256 digest and expiry:
the frontend sends a request to the worker only if its token hashes to that digest before
then, and any other to the controller, which refuses it (401) as always. Rotating the key ends
every lease. Only while the daemon's sockets are ``ipc://`` (a frontend then has a reply
socket and a worker a job socket), all in the daemon's private run folder.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass

from mservd import protocol
from mservd.core.registry import ModelVersion, Registry
from mservd.core.worker_handle import WorkerHandle

QUIET_AFTER_RECALL = 1.0  # seconds a version lends nothing after recalling a worker it used
RECALL_GRACE = 0.05  # seconds of a recall that count against no queued request's deadline:
# an idle worker's RETURNED is back within a few ms on a quiet machine, but a loaded one (CI's
# two cores under the test suite) took over 10 ms, and a request with a deadline of 0 ms, which
# an idle server runs, was answered 504 (schemathesis). A request with a deadline shorter than
# this, behind a lent worker that is running leased work, gets its 504 this late at most.
LONE_BATCHES = 4  # batches of one request in a row before a version lends


@dataclass(frozen=True, slots=True)
class Lend:
    """Tell frontend ``fid`` it may send ``lease.jobs`` batches itself."""

    fid: bytes
    lease: protocol.Lease


@dataclass(frozen=True, slots=True)
class Recall:
    """Ask ``worker`` to finish its leased batches and say when it has (RETURNED)."""

    worker: WorkerHandle


@dataclass(frozen=True, slots=True)
class Revoke:
    """Tell frontend ``fid`` the lease of the worker at ``jobs`` is over (``lost``: it is gone)."""

    fid: bytes
    jobs: str
    lost: bool


class Leases:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.enabled = False  # the controller turns lending on once its sockets are bound
        self.key: tuple[bytes, float] | None = None  # the inference key's digest and expiry
        self.reply_prefix: bytes | None = None  # what a frontend with a reply socket is named
        self.holders: dict[str, bytes] = {}  # worker id -> the frontend it is lent to
        self.lent_to: dict[str, set[bytes]] = {}  # worker id -> every frontend it was lent to
        self.recalling: dict[str, float] = {}  # worker id -> when recalled, not yet RETURNED
        self.recalled_at: dict[tuple[str, str], float] = {}  # version -> its last recall
        self.lone: dict[tuple[str, str], int] = {}  # version -> its batches of one in a row

    def holds(self, worker: WorkerHandle) -> bool:
        return worker.id in self.holders

    def lend(self, mv: ModelVersion, worker: WorkerHandle, fid: bytes, busy: Container[str],
             now: float) -> list[Lend]:
        """Lend ``worker``, which just answered frontend ``fid``, when its version is idle (no
        request queued, none of its workers running a batch of ours: ``busy``, worker ids),
        has run only lone requests lately and recalled no worker, and the frontend holds no
        lease on it yet: each frontend of several may hold one."""
        if (self.lone.get(mv.key, 0) < LONE_BATCHES
                or now - self.recalled_at.get(mv.key, -QUIET_AFTER_RECALL) < QUIET_AFTER_RECALL):
            return []
        if (not self.enabled or worker.job_endpoint is None or not worker.is_serving
                or worker.id in self.holders or worker.id in self.recalling
                or mv.settings.continuous_batching or mv.settings.sequence_batching
                or len(mv.batcher) or self.reply_prefix is None
                or not fid.startswith(self.reply_prefix)):
            return []
        for other in mv.workers.values():
            if other.id in busy or self.holders.get(other.id) == fid:
                return []
        self.holders[worker.id] = fid
        self.lent_to.setdefault(worker.id, set()).add(fid)
        # an auto-batched version's sizes are the advisor's to try: a lone request at a time
        batch = 1 if mv.settings.auto_batch else mv.batcher.batch_size
        digest, expires = self.key if self.key is not None else (None, None)
        return [Lend(fid, protocol.Lease(mv.name, mv.version, self._is_default(mv),
                                         worker.job_endpoint, batch,
                                         float(mv.settings.response_timeout), digest, expires))]

    def batch_ran(self, mv: ModelVersion, size: int) -> None:
        """Count a batch of ours: only a run of batches of one request each lets it lend."""
        self.lone[mv.key] = self.lone.get(mv.key, 0) + 1 if size == 1 else 0

    def _is_default(self, mv: ModelVersion) -> bool:
        """Whether the lent worker may take the frontend's unversioned requests: never while
        the model's versions share its traffic (core/traffic.py), or the lease would take them
        past the split and the shadow copies."""
        return (self.registry.traffic(mv.name) is None
                and self.registry.default_version(mv.name) == mv.version)

    def available(self, worker: WorkerHandle) -> bool:
        """Whether the controller may send ``worker`` a batch: neither lent nor recalled."""
        return worker.id not in self.holders and worker.id not in self.recalling

    def recall(self, worker: WorkerHandle, now: float) -> list[Revoke | Recall]:
        """The controller needs lent ``worker``: the frontend stops sending it batches, and the
        worker says when it has run those it got (:meth:`returned`)."""
        revokes = self.take_back(worker)
        self.recalling[worker.id] = now
        return [*revokes, Recall(worker)]

    def just_recalled(self, mv: ModelVersion, now: float) -> bool:
        """Whether ``mv`` waits on a recall younger than ``RECALL_GRACE``: its queued requests
        are not timed out meanwhile. A worker back that soon was idle, and without the lease
        would have taken them at once (a request with a deadline of 0 ms included); one that
        takes longer was running leased work, and their deadlines hold (they are answered 504
        at the deadline, or when the grace ends if that is later, not when it is back)."""
        return now < self.grace_ends(mv)

    def grace_ends(self, mv: ModelVersion) -> float:
        """When the youngest recall of ``mv``'s workers stops sheltering its queue (-inf
        without one): the soonest its queue's deadlines need the loop."""
        return max((self.recalling[worker.id] + RECALL_GRACE for worker in mv.workers.values()
                    if worker.id in self.recalling), default=float("-inf"))

    def returned(self, worker: WorkerHandle, now: float, used: bool) -> bool:
        """``worker`` ran its leased batches (``used``: it had some): True if it was being
        recalled."""
        if worker.id not in self.recalling:
            return False
        del self.recalling[worker.id]
        if used and worker.mv is not None:
            self.recalled_at[worker.mv.key] = now
        return True

    def take_back(self, worker: WorkerHandle) -> list[Revoke]:
        """The lease of ``worker``, if any, ends (its default version changed, or it goes)."""
        fid = self.holders.pop(worker.id, None)
        if fid is None or worker.job_endpoint is None:
            return []
        return [Revoke(fid, worker.job_endpoint, False)]

    def lost(self, worker: WorkerHandle) -> list[Revoke]:
        """``worker`` is gone: every frontend it was ever lent to resends what it sent there
        and has no answer for (one revoked meanwhile may still have a batch in it)."""
        self.holders.pop(worker.id, None)
        self.recalling.pop(worker.id, None)
        fids = self.lent_to.pop(worker.id, set())
        if worker.job_endpoint is None:
            return []
        return [Revoke(fid, worker.job_endpoint, True) for fid in sorted(fids)]

    def borrowed(self, fid: bytes, jobs: str, workers: Iterable[WorkerHandle]) -> WorkerHandle | None:
        """The worker at ``jobs`` if it was ever lent to frontend ``fid`` (which says a batch
        it sent there hung)."""
        for worker in workers:
            if worker.job_endpoint == jobs and fid in self.lent_to.get(worker.id, ()):
                return worker
        return None

    def of_model(self, name: str | None) -> list[Revoke]:
        """Every lease on a worker of model ``name`` ends (its default version changed), or
        every lease of all (``None``: the inference key changed)."""
        revokes: list[Revoke] = []
        for mv in self.registry.all_versions():
            if name is None or mv.name == name:
                for worker in mv.workers.values():
                    revokes += self.take_back(worker)
        return revokes
