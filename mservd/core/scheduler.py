"""Where requests wait and which worker runs them: admission, deadlines, taking batches,
retries, and the bookkeeping of answers.

No I/O and no clock of its own: every method takes ``now`` and returns the actions the
controller then performs (:class:`SendBatch`, :class:`Forward`, :class:`Refuse`,
:class:`KillWorker`), so the whole policy is unit-tested with a fake clock. Each model
version's queue is its :class:`~mservd.core.batcher.Batcher` (in the registry); what each worker is
running is kept here. Workers' lives (starting, serving, stopping) are the supervisor's.

A model with ``continuousBatching`` is scheduled by slots instead of batches: each of its
workers runs up to ``batch_size`` requests at once, a request is sent as soon as a slot is
free, and each finishes (DONE) on its own; a client that goes away frees its slot
(:class:`CancelRunning`). ``response_timeout`` bounds each of its worker's steps, not a whole
generation: the worker's deadline moves with each word from it (a streamed part, an answer, or
STEPPED, which a worker whose steps send nothing says every ``STEP_REPORT_INTERVAL``); a
request's own deadline (``ends_by``) bounds its generation. A request that has streamed a part
is never run again elsewhere when its worker dies: its client would get that part twice.

A stateful model (``sequenceBatching``) queues each sequence's requests apart
(:class:`~mservd.core.sequences.SequenceQueue`, its version's ``batcher``): each idle worker gets the
next request of every sequence pinned to it, one of each at a time; with continuous batching
too, each worker's free slots take its sequences' next requests, and the handler may end a
sequence in an answer's headers.

A version idle after serving a lone client lends the worker that finished last to the
frontend it answered (``leases.py``): a lent worker gets no batch here until it is recalled
and has RETURNED (:meth:`Scheduler.returned`), and is recalled only when no worker of the
version that is not lent is idle; what it runs on the lease it reports afterwards
(:meth:`Scheduler.served`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from mservd import protocol
from mservd.config import Settings
from mservd.core.advisor import advise, next_to_try
from mservd.core.leases import Leases, Lend, Recall, Revoke
from mservd.core.metrics import Metrics, VersionMetrics
from mservd.core.registry import ModelVersion, Registry
from mservd.core.sequences import ended_by
from mservd.core.traffic import Traffic, TrafficPolicy
from mservd.core.worker_handle import WorkerHandle
from mservd.errors import (
    BadRequest,
    DeadlineExceeded,
    MservdError,
    NoWorker,
    QueueFull,
    WorkerDied,
)
from mservd.protocol import DESCRIPTION, EXPLANATION, PREDICTION

# Who asked, for a shadow copy of a request (core/traffic.py): its answer is counted and
# dropped, never sent to a frontend (whose names begin with a zero byte, or ipc://)
SHADOW = b"shadow"
SIZE_EVERY = 8  # batches between two sizings of an auto-batched version: enough to measure
# a size tried (advisor.MIN_AT_SIZE) ...
SIZE_INTERVAL = 0.1  # ... and at least these seconds: a fast model is not refitted per batch


class Pending:
    """A queued or running request: who asked, its frames, and its clock."""

    __slots__ = (
        "arrived",
        "client",
        "deadline",
        "ends_by",
        "ends_sequence",
        "fid",
        "frames",
        "kind",
        "last_part",
        "retried",
        "rid",
        "sequence",
        "server_headers",
    )

    def __init__(self, rid: bytes, fid: bytes, frames: list[bytes], arrived: float,
                 deadline: float, kind: int = PREDICTION) -> None:
        self.rid = rid
        self.fid = fid
        self.frames = frames  # the meta header and payloads, forwarded as they came
        self.arrived = arrived
        self.deadline = deadline  # past it, a request still queued is refused
        # past it, a running generation is stopped: set only when a continuous-batching
        # request has a deadline of its own (the client's, or default_request_timeout_ms)
        self.ends_by = float("inf")
        self.kind = kind  # what it asks of the handler: PREDICTION, EXPLANATION, DESCRIPTION
        self.retried = False
        self.last_part: float | None = None  # when its last streamed part came
        self.sequence: str | None = None  # a stateful model's sequence (sequences.py) ...
        self.ends_sequence = False  # ... which this request ends
        self.server_headers: dict[str, str] | None = None  # headers the worker adds: its id
        self.client: str | None = None  # who sent it: the owner of a sequence it opens


@dataclass(frozen=True, slots=True)
class SendBatch:
    """Hand ``requests`` to ``worker`` as one BATCH."""

    worker: WorkerHandle
    requests: list[Pending]


@dataclass(frozen=True, slots=True)
class Forward:
    """A worker's answer, to the frontend ``fid`` that asked."""

    fid: bytes
    result: protocol.Result


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer request ``rid`` of frontend ``fid`` with ``error``; it is not computed."""

    fid: bytes
    rid: bytes
    error: MservdError


@dataclass(frozen=True, slots=True)
class KillWorker:
    worker: WorkerHandle
    reason: str


@dataclass(frozen=True, slots=True)
class CancelRunning:
    """Tell ``worker`` to drop request ``rid``: its client went away (continuous batching)."""

    worker: WorkerHandle
    rid: bytes


Action = SendBatch | Forward | Refuse | KillWorker | CancelRunning | Lend | Revoke | Recall


@dataclass
class Running:
    """The batch one worker is running."""

    mv: ModelVersion
    requests: dict[bytes, Pending]
    started: float
    deadline: float  # past it the batch has hung: the worker is killed
    counted: bool = True  # False: the controller's own question, not the model's traffic


class Scheduler:
    def __init__(self, settings: Settings, registry: Registry, metrics: Metrics) -> None:
        self.settings = settings
        self.registry = registry
        self.metrics = metrics
        self.running: dict[str, Running] = {}  # worker id -> its batch
        self.leases = Leases(registry)
        self.traffic = Traffic(settings.traffic_error_window_s, settings.traffic_min_requests,
                               settings.traffic_cooldown_s, random.random)
        self.shadows: dict[bytes, tuple[str, str]] = {}  # a shadow copy's rid -> its version

    # -- requests ---------------------------------------------------------------------

    def submit(self, fid: bytes, route: protocol.Route, frames: list[bytes],
               now: float) -> list[Action]:
        """A new request: refused at once, or queued (and maybe sent straight to a worker)."""
        mv, actions = self.enqueue(fid, route, frames, now)
        return actions if mv is None else actions + self.dispatch(mv, now)

    def enqueue(self, fid: bytes, route: protocol.Route, frames: list[bytes],
                now: float) -> tuple[ModelVersion | None, list[Action]]:
        """A new request, refused at once or queued: its version, to :meth:`dispatch` once
        every request that came with it is queued too (they may then share a batch), or
        (None, its refusal). A request naming no version of a model whose versions share its
        traffic goes to the version its policy picks; with it come the actions of its shadow
        copies, which never change its own answer."""
        mv = None
        policy = self.registry.traffic(route.model) if route.version is None else None
        try:
            mv = self.registry.get(route.model, route.version if policy is None
                                   else self.pick_version(route, policy, now))
            self._queue(mv, fid, route, frames, now)
        except MservdError as exc:
            return None, [self.refuse(fid, route.rid, exc, mv, route.model)]
        self.metrics.version(mv.key).requests.inc()
        if policy is not None and policy.shadow:
            return mv, self._shadow(mv, route, policy, frames, now)
        return mv, []

    def pick_version(self, route: protocol.Route, policy: TrafficPolicy,
                     now: float) -> str | None:
        """The version an unversioned request of a model with a traffic policy goes to: a
        stateful model's sequence stays on the version that opened it; otherwise the policy
        picks among the versions with a live worker and no open breaker (None: the default
        version, none being eligible)."""
        versions = self.registry.versions(route.model)
        if route.sequence:
            for mv in versions:
                if mv.settings.sequence_batching and mv.sequences.is_open(route.sequence):
                    return mv.version
        by_version = {mv.version: mv for mv in versions}

        def eligible(version: str) -> bool:
            mv = by_version.get(version)
            if mv is None:
                return False
            if not any(w.is_serving for w in mv.workers.values()):
                self.metrics.traffic_excluded.labels(mv.name, version, "no_worker").inc()
                return False
            if self.traffic.tripped(mv.key, now):
                self.metrics.traffic_excluded.labels(mv.name, version, "error_rate").inc()
                return False
            return True

        group, key = protocol.split_key(route.key)
        key = key or route.sequence  # a sequence's requests stay together
        return self.traffic.choose(policy, list(by_version), eligible, key, group)

    def review_traffic(self, now: float) -> list[tuple[str, str, float]]:
        """Sample each bounded version's answers (``Traffic.review``): the versions whose
        5xx rate trips their breaker now, as (model, version, rate). Nothing of this runs per
        request: the counts by status are kept anyway."""
        tripped = []
        for name in self.registry.names():
            policy = self.registry.traffic(name)
            if policy is None or not policy.max_error_rate:
                continue
            answers = {v: self.metrics.version((name, v)).answers for v in policy.max_error_rate}
            for version in self.traffic.review(name, policy, answers, now):
                self.metrics.traffic_trips.labels(name, version).inc()
                tripped.append((name, version, self.traffic.health_of((name, version)).rate))
        return tripped

    def _shadow(self, mv: ModelVersion, route: protocol.Route, policy: TrafficPolicy,
                frames: list[bytes], now: float) -> list[Action]:
        """Copies of an admitted request for the shadow versions its draws pick: the same
        frames, answered to SHADOW (counted, then dropped). A copy refused is only counted."""
        actions: list[Action] = []
        for version in self.traffic.shadows(policy):
            copy = dataclasses.replace(route, rid=route.rid + b"~s" + version.encode(),
                                       version=version)
            try:
                shadow = self.registry.get(mv.name, version)
                self._queue(shadow, SHADOW, copy, frames, now)
            except MservdError:
                self.metrics.shadowed(mv.name, version, "dropped")
                continue
            self.metrics.version(shadow.key).requests.inc()
            self.metrics.shadowed(mv.name, version, "sent")
            self.shadows[copy.rid] = shadow.key
            actions += self.dispatch(shadow, now)
        return actions

    def _queue(self, mv: ModelVersion, fid: bytes, route: protocol.Route, frames: list[bytes],
               now: float) -> None:
        """Put one request in ``mv``'s queue, or raise what it is refused with."""
        if not any(w.is_serving for w in mv.workers.values()):
            raise NoWorker(f"No worker is available to serve model: {mv.name} "
                           f"version: {mv.version}. Check its workers with "
                           f"GET /models/{mv.name}/{mv.version}.")
        # the frontend's send time, when sane: time in the pipe to here counts as waiting
        sent = route.sent
        arrived = sent if sent is not None and 0.0 <= now - sent < 60.0 else now
        deadline = arrived + self.queue_timeout(mv, route)
        self._admit(mv, now, arrived, deadline)
        pending = Pending(route.rid, fid, frames, arrived, deadline,
                          EXPLANATION if route.explain else PREDICTION)
        if mv.settings.continuous_batching:
            pending.ends_by = arrived + self.request_timeout(route)
        if mv.settings.sequence_batching:
            # an empty id, as none, opens a new sequence (TorchServe's rule, over HTTP
            # and gRPC alike)
            pending.sequence = route.sequence or None
            pending.ends_sequence = route.ends_sequence
            pending.client = route.client
            if pending.sequence is not None and len(pending.sequence) > 256:
                raise BadRequest("The ts_request_sequence_id header must have at most 256 "
                                 "characters.")
            if pending.sequence is not None and ";" in pending.sequence:
                # a handler names the sequences it ends in one header, ';' between them:
                # one id with ';' in it could end other clients' sequences
                raise BadRequest("The ts_request_sequence_id header must not contain ';'.")
            added = mv.sequences.add_to_sequence(pending, now,
                                               self.settings.max_sequences_per_client)
        else:
            added = mv.batcher.add(pending)
        if not added:
            raise QueueFull(
                f"Model {mv.name} version {mv.version} has {mv.batcher.capacity} requests "
                "queued (job_queue_size); retry later.",
                headers={"Retry-After": "1"})

    def ask(self, mv: ModelVersion, fid: bytes, rid: bytes, frames: list[bytes],
            now: float) -> list[Action]:
        """A describe call's question to the version's handler (TorchServe's
        ``customized=true``), answered to ``fid``: queued behind the requests, run in a batch
        of its own, and kept out of the version's request counts and batch timings. Raises
        what a request would be refused with."""
        if not any(w.is_serving for w in mv.workers.values()):
            raise NoWorker(f"No worker is available to describe model: {mv.name} version: "
                           f"{mv.version}. Use scale workers API to add workers for the model.")
        pending = Pending(rid, fid, frames, now, now + mv.settings.response_timeout,
                          DESCRIPTION)
        if not mv.batcher.add(pending):
            raise QueueFull(f"Model {mv.name} version {mv.version} has "
                            f"{mv.batcher.capacity} requests queued (job_queue_size); retry "
                            "later.", headers={"Retry-After": "1"})
        return self.dispatch(mv, now)

    def _admit(self, mv: ModelVersion, now: float, arrived: float, deadline: float) -> None:
        """Refuse at once what cannot be answered in time; by default that is only a request
        that would pass its deadline (its own timeout, the default, the response timeout)
        waiting behind the batches queued before it — a full queue is refused by the batcher.
        A model's latency target (maxLatencyMs) sheds to meet it: refused while its queue's
        head has waited so long that one more batch time passes the target, unless its
        refused clients only come straight back (``spinning.py``). The server-wide
        ``max_queue_wait_ms`` (0, off, by default) refuses a queue standing longer than
        batching asks (max_batch_delay) plus that wait, or four batch times if longer."""
        if mv.settings.continuous_batching:
            return  # a generation waits for a slot as long as a sequence takes: job_queue_size
            # bounds its queue instead
        waited = max(now - arrived, mv.batcher.oldest_wait(now))
        target = mv.settings.latency_target
        if (target is not None and waited + mv.batch_seconds > target
                and not mv.target_spin.resting(now)):
            mv.target_spin.refusal(now)
            raise QueueFull(
                f"Model {mv.name} version {mv.version} is over its latency target: requests "
                f"have waited {waited * 1000:.0f} ms and a batch takes "
                f"{mv.batch_seconds * 1000:.0f} ms (maxLatencyMs {mv.settings.max_latency_ms})"
                "; retry later.", headers={"Retry-After": "1"})
        limit = self.settings.max_queue_wait_ms / 1000.0
        if limit:
            limit = mv.settings.max_batch_delay / 1000.0 + max(limit, 4 * mv.batch_seconds)
            if waited > limit:
                raise QueueFull(
                    f"Model {mv.name} version {mv.version} is overloaded: requests have waited "
                    f"{waited * 1000:.0f} ms to be served (max_queue_wait_ms allows "
                    f"{limit * 1000:.0f}); retry later.", headers={"Retry-After": "1"})
        wait = self.expected_wait(mv)
        if wait > 0 and now + wait > deadline:  # nothing ahead: it may still run at once
            raise QueueFull(
                f"Model {mv.name} version {mv.version} cannot answer this request within its "
                f"deadline ({deadline - arrived:.3f} s): the requests queued before it take "
                f"about {wait:.3f} s; retry later.", headers={"Retry-After": "1"})

    def expected_wait(self, mv: ModelVersion) -> float:
        """About how long a request queued now waits for a worker: the rounds of batches its
        live workers need for the requests ahead of it, at the version's recent batch time
        (0 until it has run a batch)."""
        per_round = max(1, mv.live_count()) * mv.batcher.batch_size
        return (len(mv.batcher) // per_round) * mv.batch_seconds

    def queue_timeout(self, mv: ModelVersion, route: protocol.Route) -> float:
        """Seconds a request may wait for a worker: its own ask, the default, the model's."""
        return min(float(mv.settings.response_timeout), self.request_timeout(route))

    def request_timeout(self, route: protocol.Route) -> float:
        """Seconds the client gives a request, its own ask or the default; unbounded (inf)
        without either. It bounds a whole generation: response_timeout bounds each step."""
        limit = float("inf")
        if self.settings.default_request_timeout_ms:
            limit = self.settings.default_request_timeout_ms / 1000.0
        if route.timeout_ms is not None and route.timeout_ms >= 0:
            limit = min(limit, route.timeout_ms / 1000.0)
        return limit

    def cancel(self, fid: bytes, rid: bytes,
               now: float) -> tuple[ModelVersion | None, list[Action]]:
        """The client went away: a request still queued is dropped (its version is returned);
        a running one finishes, unless its worker batches continuously: then it is dropped
        there too and its slot goes to the next request."""
        for mv in self.registry.all_versions():
            if mv.batcher.remove(lambda p: p.rid == rid and p.fid == fid):
                return mv, []
        for worker_id, running in self.running.items():
            pending = running.requests.get(rid)
            if (pending is None or pending.fid != fid
                    or not running.mv.settings.continuous_batching):
                continue
            worker = running.mv.workers.get(worker_id)
            del running.requests[rid]
            if running.mv.settings.sequence_batching:
                running.mv.sequences.finished([pending], now)
            if not running.requests:
                del self.running[worker_id]
            actions: list[Action] = [] if worker is None else [CancelRunning(worker, rid)]
            return running.mv, actions + self.dispatch(running.mv, now)
        return None, []

    # -- batches --------------------------------------------------------------------

    def is_busy(self, worker: WorkerHandle) -> bool:
        return worker.id in self.running

    def dispatch(self, mv: ModelVersion, now: float) -> list[Action]:
        """Hand batches to the version's idle workers, as the batching policy allows."""
        if not len(mv.batcher):
            return []
        if mv.settings.continuous_batching:
            return self._fill_slots(mv, now)
        if mv.settings.sequence_batching:
            return self._run_sequences(mv, now)
        idle = [w for w in mv.workers.values()
                if w.is_serving and w.id not in self.running]
        if self.leases.holders or self.leases.recalling:
            ready = [w for w in idle if self.leases.available(w)]
            if not ready:  # only lent ones: one is called back, the queue waits for it
                lent = [w for w in idle if self.leases.holds(w)]
                recalled: list[Action] = [*self.leases.recall(lent[0], now)] if lent else []
                return recalled
            idle = ready
        if not idle:
            return []
        any_busy = any(w.id in self.running for w in mv.workers.values())
        # No batch beyond a worker's share of what the version holds: a lone request sent at
        # once to one idle worker would otherwise leave the next one all its batch-mates
        # (resnet18 at c=8: batches of 1 and 7 by turns, where 4 and 4 are due).
        held = len(mv.batcher) + self.running_requests(mv)
        share = -(-held // max(mv.live_count(), 1))
        actions: list[Action] = []
        vm = self.metrics.version(mv.key)
        for worker in idle:
            batch = mv.queue.take(now, any_busy, share=share)
            if not batch:
                break
            actions.append(self._send(mv, worker, batch, vm, now))
            any_busy = True
        return actions

    def _send(self, mv: ModelVersion, worker: WorkerHandle, batch: list[Pending],
              vm: VersionMetrics, now: float) -> SendBatch:
        """``batch`` leaves the queue for ``worker``: its waits counted (a describe call's
        question is not the model's traffic), and it is running there until DONE."""
        counted = batch[0].kind != DESCRIPTION
        if counted:
            observe_waits(vm, batch, now)
        self.running[worker.id] = Running(mv, {p.rid: p for p in batch}, now,
                                          now + mv.settings.response_timeout, counted)
        return SendBatch(worker, batch)

    def _run_sequences(self, mv: ModelVersion, now: float) -> list[Action]:
        """A stateful model: each idle worker gets the next request of its sequences."""
        live = [w.id for w in mv.workers.values() if w.is_serving]
        actions: list[Action] = []
        vm = self.metrics.version(mv.key)
        for worker in mv.workers.values():
            if not worker.is_serving or worker.id in self.running:
                continue
            batch = mv.sequences.take_for(worker.id, live, now)
            if not batch:
                continue
            actions.append(self._send(mv, worker, batch, vm, now))
            if not len(mv.batcher):
                break
        return actions

    def _fill_slots(self, mv: ModelVersion, now: float) -> list[Action]:
        """Continuous batching: each serving worker gets queued requests for its free slots
        (a stateful model's: of the sequences pinned to it; any other's spread by
        :meth:`_spread`)."""
        actions: list[Action] = []
        vm = self.metrics.version(mv.key)
        workers = [w for w in mv.workers.values() if w.is_serving]
        if mv.settings.sequence_batching:  # a new sequence goes to the one holding fewest
            workers.sort(key=lambda w: mv.sequences.held(w.id))
            live = [w.id for w in workers]
            wanted = {w.id: self._free_slots(mv, w) for w in workers}
        else:
            wanted = self._spread(mv, workers)
        for worker in workers:
            free = wanted.get(worker.id, 0)
            if free <= 0:
                continue
            if mv.settings.sequence_batching:
                batch = mv.sequences.take_for(worker.id, live, now, slots=free)
            else:
                batch = mv.queue.take(now, False, free)
            if not batch:
                continue
            observe_waits(vm, batch, now)
            running = self.running.get(worker.id)
            if running is None:
                running = self.running[worker.id] = Running(mv, {}, now, step_deadline(mv, now))
            running.requests.update((p.rid, p) for p in batch)  # (a busy worker's deadline
            # stays: new requests are no sign that its step goes on)
            actions.append(SendBatch(worker, batch))
            if not len(mv.batcher):
                break
        return actions

    def _free_slots(self, mv: ModelVersion, worker: WorkerHandle) -> int:
        running = self.running.get(worker.id)
        return mv.settings.batch_size - (len(running.requests) if running else 0)

    def _spread(self, mv: ModelVersion, workers: list[WorkerHandle]) -> dict[str, int]:
        """How many of the queued requests each worker takes: one by one, each to the worker
        running the fewest, then to the one whose KV cache is least full (as its handler last
        reported), so that a generation model's workers share the streams instead of the
        first one filling its slots while another idles."""
        free = {w.id: self._free_slots(mv, w) for w in workers}
        held = {w.id: mv.settings.batch_size - free[w.id] for w in workers}
        fullness = {w.id: w.kv_cache[0] / w.kv_cache[1] if w.kv_cache and w.kv_cache[1] else 0.0
                    for w in workers}
        wanted = dict.fromkeys(free, 0)
        for _ in range(len(mv.batcher)):
            open_ = [w for w in free if wanted[w] < free[w]]
            if not open_:
                break
            best = min(open_, key=lambda w: (held[w] + wanted[w], fullness[w]))
            wanted[best] += 1
        return wanted

    def progress(self, worker: WorkerHandle, rid: bytes, now: float,
                 head: bytes = b"") -> bytes | None:
        """A streamed part of request ``rid`` came from ``worker``: the frontend that asked
        (None: not one it runs). Times the first part and the gaps between parts, and moves
        a continuous worker's deadline; a stateful model's handler may end sequences in the
        part's ``head``."""
        running = self.running.get(worker.id)
        pending = running.requests.get(rid) if running is not None else None
        if running is None or pending is None:
            return None
        if head and running.mv.settings.sequence_batching:
            running.mv.sequences.end(ended_by(protocol.Head.parse(head).headers), now)
        vm = self.metrics.version(running.mv.key)
        if pending.last_part is None:
            vm.first_part.observe(now - pending.arrived)
        else:
            vm.between_parts.observe(now - pending.last_part)
        pending.last_part = now
        if running.mv.settings.continuous_batching:
            running.deadline = step_deadline(running.mv, now)
        return pending.fid

    def stepped(self, worker: WorkerHandle, now: float,
                firsts: Sequence[tuple[bytes, float]] = (), gaps: Sequence[float] = ()
                ) -> None:
        """A continuous worker's STEPPED: its steps go on though they sent the controller
        nothing, so its step deadline moves. ``firsts`` (rid, when) are streams whose parts it
        sends their frontends itself, begun: each is timed to its first part and is never run
        again should the worker die; ``gaps`` are the times between such parts."""
        running = self.running.get(worker.id)
        if running is None or not running.mv.settings.continuous_batching:
            return
        vm = self.metrics.version(running.mv.key)
        for rid, at in firsts:
            pending = running.requests.get(rid)
            if pending is not None and pending.last_part is None:
                vm.first_part.observe(max(0.0, at - pending.arrived))
                pending.last_part = at
        for gap in gaps:
            vm.between_parts.observe(gap)
        running.deadline = step_deadline(running.mv, now)

    def finished(self, worker: WorkerHandle, results: list[protocol.Result], now: float,
                 answered: bool = False) -> list[Action]:
        """A worker's DONE: each answer to its frontend, a missing one as an error; then the
        worker's next batch. ``answered`` (ANSWERED): the worker sent the answers itself, so
        they are only counted. A continuous worker's DONE answers only the requests that
        finished; the others run on."""
        running = self.running.get(worker.id)
        if running is None:
            return []
        mv = running.mv
        if mv.settings.continuous_batching:
            return self._finished_some(worker, running, results, now, answered)
        del self.running[worker.id]
        if mv.settings.sequence_batching:
            mv.sequences.finished(list(running.requests.values()), now)
        if not running.counted:
            return self._answered_question(running, results) + self.dispatch(mv, now)
        vm = self.metrics.version(mv.key)
        vm.batch.observe(len(running.requests))
        self.leases.batch_ran(mv, len(running.requests))
        took = now - running.started
        vm.handler.observe(took)
        mv.batch_seconds += 0.2 * (took - mv.batch_seconds)
        mv.batch_costs.add(len(running.requests), took,
                           full=len(running.requests) >= mv.batcher.batch_size)
        mv.target_spin.answers(len(results), now)
        if (mv.settings.auto_batch or mv.settings.max_latency_ms) and not (
                mv.settings.sequence_batching):  # a stateful batch holds its sequences
            held = len(running.requests) + len(mv.batcher) + self.running_requests(mv)
            self._size_batches(mv, now, held)
        actions: list[Action] = []
        fid = None
        for result in results:
            pending = running.requests.pop(result.rid, None)
            if pending is not None:
                fid = pending.fid
                if not answered:
                    actions.append(Forward(pending.fid, result))
                latency = now - pending.arrived
                vm.latency.observe(latency)
                vm.latency_us.inc(latency * 1e6)
                self.metrics.answered(protocol.Head.parse(result.head).status, vm)
        for pending in running.requests.values():
            actions.append(self.refuse(pending.fid, pending.rid, WorkerDied(
                "The worker returned no answer for this request."), mv))
        more = self.dispatch(mv, now)
        if not more and fid is not None:  # nothing more to run: the frontend may send itself
            more = [*self.leases.lend(mv, worker, fid, self.running, now)]
        return actions + more

    def _answered_question(self, running: Running, results: list[protocol.Result]
                           ) -> list[Action]:
        """The answer to a question of :meth:`ask`, to whoever asked: nothing counted."""
        actions: list[Action] = []
        for result in results:
            pending = running.requests.pop(result.rid, None)
            if pending is not None:
                actions.append(Forward(pending.fid, result))
        return actions + [Refuse(p.fid, p.rid, WorkerDied("The worker returned no answer."))
                          for p in running.requests.values()]

    def returned(self, worker: WorkerHandle, now: float, used: bool = True) -> list[Action]:
        """A recalled worker ran its leased batches (``used``: it had some): it takes the
        queue's next batch."""
        if not self.leases.returned(worker, now, used) or worker.mv is None:
            return []
        return self.dispatch(worker.mv, now)

    def served(self, worker: WorkerHandle, batch: protocol.Served) -> list[Action]:
        """A lent worker's SERVED: the batch a frontend sent it, counted like a batch of ours
        (its time in the worker is its latency); forwarded when the worker could not deliver
        it. The worker stays as it was: idle, or running the batch we sent it since."""
        mv = worker.mv
        if mv is None:
            return []
        vm = self.metrics.version(mv.key)
        vm.batch.observe(len(batch.results))
        vm.handler.observe(batch.took)
        actions: list[Action] = []
        vm.leased.inc(len(batch.results))
        for result in batch.results:
            vm.requests.inc()
            vm.queue.observe(0.0)  # it waited in no queue
            vm.latency.observe(batch.took)
            vm.latency_us.inc(batch.took * 1e6)
            self.metrics.answered(protocol.Head.parse(result.head).status, vm)
            if not batch.delivered:
                actions.append(Forward(batch.fid, result))
        return actions

    def _finished_some(self, worker: WorkerHandle, running: Running, results: list[protocol.Result],
                       now: float, answered: bool) -> list[Action]:
        mv = running.mv
        vm = self.metrics.version(mv.key)
        actions: list[Action] = []
        for result in results:
            pending = running.requests.pop(result.rid, None)
            if pending is None:
                continue  # cancelled meanwhile
            if not answered:
                actions.append(Forward(pending.fid, result))
            latency = now - pending.arrived
            vm.latency.observe(latency)
            vm.latency_us.inc(latency * 1e6)
            if pending.last_part is None:
                vm.first_part.observe(latency)
            head = protocol.Head.parse(result.head)
            self.metrics.answered(head.status, vm)
            if mv.settings.sequence_batching:  # SequenceContinuousBatching
                mv.sequences.end(ended_by(head.headers), now)
                mv.sequences.finished([pending], now)
        running.deadline = step_deadline(mv, now)
        if not running.requests:
            del self.running[worker.id]
        return actions + self.dispatch(running.mv, now)

    def running_requests(self, mv: ModelVersion) -> int:
        """Requests the version's workers are running now."""
        return sum(len(r.requests) for r in self.running.values() if r.mv is mv)

    def worker_lost(self, worker: WorkerHandle, now: float) -> list[Action]:
        """A worker exited: its requests that sent their client nothing run once more on
        another worker, the others fail; its lease ends (the frontends send again what they
        had sent it)."""
        actions: list[Action] = list(self.leases.lost(worker))
        running = self.running.pop(worker.id, None)
        if running is None:
            return actions
        mv = running.mv
        if mv.settings.sequence_batching:  # its sequences go to the next idle worker
            mv.sequences.worker_lost(worker.id)
        for pending in reversed(running.requests.values()):  # each put first: in order
            if (not pending.retried and pending.last_part is None
                    and self.registry.has_version(mv.name, mv.version)
                    and any(w.is_serving and w is not worker for w in mv.workers.values())):
                pending.retried = True
                mv.batcher.push_front(pending)
            else:
                actions.append(self.refuse(pending.fid, pending.rid, died_running(pending), mv))
                if mv.settings.sequence_batching:
                    mv.sequences.finished([pending], now)
        return actions + self.dispatch(mv, now)

    # -- upkeep ---------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        """Kill workers whose batch hangs, answer requests past their deadline, and send the
        batches that are due."""
        actions: list[Action] = []
        for running_id, running in list(self.running.items()):
            actions += self._stop_overdue(running_id, running, now)
            if running_id in self.running and now > running.deadline:
                worker = running.mv.workers.get(running_id)
                if worker is None:
                    continue
                for pending in running.requests.values():
                    pending.retried = True  # a batch that hangs is not worth running twice
                running.deadline = float("inf")  # killed once; worker_lost answers the rest
                what = "a step" if running.mv.settings.continuous_batching else "batch"
                actions.append(KillWorker(worker, f"{what} ran past response_timeout "
                                                  f"({running.mv.settings.response_timeout} s)"))
        for mv in self.registry.all_versions():
            if self.leases.recalling and self.leases.just_recalled(mv, now):
                continue  # its worker may be idle, back at once: the queue waits for it untimed
            for pending in mv.batcher.expire(now):
                waited = now - pending.arrived
                actions.append(self.refuse(pending.fid, pending.rid, DeadlineExceeded(
                    f"The request waited {waited:.3f} s, past its deadline, in the queue of "
                    f"model {mv.name} version {mv.version}; it was not computed."), mv))
            if len(mv.batcher):
                actions += self.dispatch(mv, now)
        return actions

    def _stop_overdue(self, worker_id: str, running: Running, now: float) -> list[Action]:
        """Generations past their own deadline: dropped in the worker, and their streams end
        with an error (a continuous batch keeps ``ends_by`` of inf otherwise)."""
        overdue = [p for p in running.requests.values() if now > p.ends_by]
        if not overdue:
            return []
        worker = running.mv.workers.get(worker_id)
        actions: list[Action] = []
        for pending in overdue:
            del running.requests[pending.rid]
            if running.mv.settings.sequence_batching:
                running.mv.sequences.finished([pending], now)
            if worker is not None:
                actions.append(CancelRunning(worker, pending.rid))
            actions.append(self.refuse(pending.fid, pending.rid, DeadlineExceeded(
                f"The request ran past its deadline ({pending.ends_by - pending.arrived:.3f} s "
                f"after it arrived) while model {running.mv.name} generated its answer; the "
                "rest was not computed."), running.mv))
        if not running.requests:
            del self.running[worker_id]
        return actions + self.dispatch(running.mv, now)

    def next_wakeup(self, soonest: float, now: float = float("-inf")) -> float:
        """The earlier of ``soonest`` and when :meth:`tick` may next have something to do
        (``now``: a stateful model's batch delays that have passed are no longer due)."""
        for mv in self.registry.all_versions():
            if len(mv.batcher) and mv.settings.sequence_batching:
                when = mv.sequences.next_wakeup(now)
                if when is not None and when < soonest:
                    soonest = when
            elif len(mv.batcher) and mv.settings.continuous_batching:
                # a slot frees only by a worker's answer, which wakes the loop itself: only a
                # deadline is due (a batch delay passed with every slot taken made it spin)
                when = mv.queue.next_wakeup(False)
                if when is not None and when < soonest:
                    soonest = when
            elif len(mv.batcher):
                busy = any(w.id in self.running for w in mv.workers.values())
                # a worker takes a batch only when it is idle: past its batch delay a queue
                # with none idle would wake the loop in a spin (a lent or recalled worker is
                # not idle here: its RETURNED wakes the loop)
                idle = any(
                    w.is_serving and w.id not in self.running and self.leases.available(w)
                    for w in mv.workers.values())
                when = mv.queue.next_wakeup(busy, idle)
                if when is not None and self.leases.recalling:  # no spin through a grace: the
                    when = max(when, self.leases.grace_ends(mv))  # worker's RETURNED wakes it
                if when is not None and when < soonest:
                    soonest = when
        for running in self.running.values():
            soonest = min(soonest, running.deadline)
            if running.mv.settings.continuous_batching:
                for pending in running.requests.values():
                    soonest = min(soonest, pending.ends_by)
        return soonest

    def retire(self, mv: ModelVersion) -> list[Action]:
        """A version was unregistered: its queue is answered."""
        return [self.refuse(p.fid, p.rid, NoWorker(
            f"Model {mv.name} version {mv.version} was unregistered."), mv)
            for p in mv.batcher.drain()]

    def idle(self) -> bool:
        """Nothing queued and nothing running: a stop may end."""
        return not self.running and not any(len(mv.batcher)
                                            for mv in self.registry.all_versions())

    def close(self, reason: str) -> list[Action]:
        """The server stops: every queued and running request is answered."""
        actions: list[Action] = []
        for mv in self.registry.all_versions():
            actions += [self.refuse(p.fid, p.rid, WorkerDied(reason)) for p in mv.batcher.drain()]
        for running in self.running.values():
            actions += [self.refuse(p.fid, p.rid, WorkerDied(reason))
                        for p in running.requests.values()]
        self.running.clear()
        return actions

    def refuse(self, fid: bytes, rid: bytes, error: MservdError,
               mv: ModelVersion | None = None, model: str | None = None) -> Refuse:
        """The answer to a request refused with ``error``: counted as answered, by the error's
        type, and kept in the dashboard's log of recent refusals."""
        vm = self.metrics.version(mv.key) if mv is not None else None
        self.metrics.answered(error.http_status, vm)
        self.metrics.refused[error.type] += 1
        self.metrics.event("refused", error.message, rid=rid.decode("ascii", "replace"),
                           status=error.http_status, model=mv.name if mv else model,
                           version=mv.version if mv else None)
        return Refuse(fid, rid, error)

    def _size_batches(self, mv: ModelVersion, now: float, held: int) -> None:
        """batchSize: auto, or a latency target: every SIZE_EVERY batches (SIZE_INTERVAL
        apart at least) the batcher takes the batch size and delay the advisor gives for the
        recent ones, or a neighbouring size to measure it (``advisor.next_to_try``). A target
        alone never raises the batch set. Auto batches are no larger than the live workers'
        share of the most requests the version held lately (``held`` now, and
        ``ModelVersion.largest_batch``; why in BENCHMARKS.md, "The batching advisor against
        fixed batch sizes")."""
        mv.batches_since_sized += 1
        mv.held.append(held)
        if mv.batches_since_sized < SIZE_EVERY or now - mv.sized_at < SIZE_INTERVAL:
            return
        mv.batches_since_sized = 0
        mv.sized_at = now
        fit = mv.batch_costs.fit()
        measured = mv.batch_costs.measured()
        target = mv.settings.latency_target
        largest = mv.largest_batch() if mv.settings.auto_batch else mv.settings.batch_size
        if fit is None and not any(m.enough for m in measured.values()):
            return  # nothing to judge by yet: keep what is set
        advice = advise(fit, target, largest, measured)
        mv.batcher.batch_size = (next_to_try(advice, fit, target, largest, measured)
                                 or advice.batch_size)
        if advice.max_batch_delay_ms is not None:
            mv.batcher.max_batch_delay = advice.max_batch_delay_ms / 1000.0


def step_deadline(mv: ModelVersion, now: float) -> float:
    """When a continuous worker last heard from at ``now`` has hung: its step has run past
    response_timeout (a worker says STEPPED only every STEP_REPORT_INTERVAL, so a step began
    at most that long after its last word)."""
    return now + mv.settings.response_timeout + protocol.STEP_REPORT_INTERVAL


def died_running(pending: Pending) -> WorkerDied:
    """The error of a request whose worker died under it. One that had streamed parts is
    never run again: its client would get those parts twice (a generation replayed from its
    start), so its stream ends with this error instead."""
    return WorkerDied() if pending.last_part is None else WorkerDied.after_parts()


def observe_waits(vm: VersionMetrics, batch: list[Pending], now: float) -> None:
    """Record how long each request of a batch leaving the queue waited in it."""
    for pending in batch:
        waited = now - pending.arrived
        vm.queue.observe(waited)
        vm.queue_us.inc(waited * 1e6)
