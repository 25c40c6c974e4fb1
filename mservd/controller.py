"""The controller: the one process that owns state, and the loop that moves every request.

Two ROUTER sockets: frontends (HTTP and gRPC processes) send requests and management calls on
one, backend workers talk on the other. Each turn of the loop waits until the next deadline,
handles what arrived (``on_predict``, ``on_manage``, ``on_worker``), then always reaps and
times out workers, expires queued requests and flushes batches that are due. Nothing blocks:
archive unpacking runs on a helper thread whose result the loop picks up, and replies that must
wait (a synchronous register or scale) are kept as ``Waiter``s and answered when they can be.

Per request the controller reads only the route header and forwards payload frames as they are.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import zmq

from mservd import protocol, snapshot
from mservd.auth import INFERENCE, MANAGEMENT, KeyStore
from mservd.config import Settings
from mservd.errors import (
    DeadlineExceeded,
    MservdError,
    NoWorker,
    QueueFull,
    WorkerDied,
    error_body,
)
from mservd.management import Management
from mservd.metrics import Metrics
from mservd.protocol import Reply
from mservd.registry import ModelVersion, Registry
from mservd.supervisor import Supervisor
from mservd.waiter import Waiter
from mservd.worker_handle import Worker, WorkerState

log = logging.getLogger(__name__)

MAINTENANCE_INTERVAL = 0.1  # seconds between reaping/timeout sweeps under load
IDLE_POLL = 1.0


class Pending:
    """A queued or running request: who asked, its frames, and its clock."""

    __slots__ = ("rid", "fid", "frames", "arrived", "deadline", "explain", "retried")

    def __init__(self, rid: bytes, fid: bytes, frames: list[bytes], arrived: float,
                 deadline: float, explain: bool = False) -> None:
        self.rid = rid
        self.fid = fid
        self.frames = frames  # the meta header and payloads, forwarded as they came
        self.arrived = arrived
        self.deadline = deadline
        self.explain = explain
        self.retried = False


# The keys a controller verb may be called with, decided by the verb: the API a frontend says a
# call came from only picks among them. Verbs not listed need the management key.
VERB_KEYS: dict[str, tuple[str, ...]] = {
    "ping": (), "metrics": (), "token": (),  # open; "token" checks the API key itself
    "list": (INFERENCE, MANAGEMENT),  # GET /v1/models (inference) and GET /models
    "v2_model_ready": (INFERENCE,), "v2_model_metadata": (INFERENCE,),
    "authorize": (INFERENCE,),  # a frontend's check of a prediction's token, before its body
}


def key_for(op: str, api: str | None) -> str | None:
    """The key a MANAGE call of ``op`` must carry (None: no key), whatever ``api`` claims."""
    allowed = VERB_KEYS.get(op, (MANAGEMENT,))
    if not allowed:
        return None
    claimed = INFERENCE if api == protocol.API_INFERENCE else MANAGEMENT
    return claimed if claimed in allowed else allowed[0]


class Controller:
    def __init__(self, settings: Settings, frontend_endpoint: str, backend_endpoint: str,
                 run_dir: Path, keys: KeyStore | None, gpu_count: int) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.keys = keys
        self.gpu_count = gpu_count
        self.zctx = zmq.Context()
        self.front = self._bind(zmq.ROUTER, frontend_endpoint)
        self.back = self._bind(zmq.ROUTER, backend_endpoint)
        self.registry = Registry()
        self.supervisor = Supervisor(
            backend_endpoint,
            Path(settings.log_dir),
            gpu_count,
            send_stop=lambda w: self.back.send_multipart([w.identity, *protocol.stop()]),
            worker_spec_extra={"max_response_size": settings.max_response_size,
                               "log_level": settings.log_level,
                               "log_format": settings.log_format,
                               "install_py_dep_per_model": settings.install_py_dep_per_model},
        )
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mservd-unpack")
        self.tasks: list[tuple[Future, Callable[[Future], None]]] = []
        self.waiters: list[Waiter] = []
        self.loading: set[tuple[str, str]] = set()
        self.retired: list[ModelVersion] = []
        self.startup_pending = 0
        self.stopping = False
        self.stop_deadline = 0.0
        self._last_maintenance = 0.0
        self.on_stopped: Callable[[], None] | None = None
        self.metrics = Metrics()
        self.management = Management(self)  # the management verbs, on a narrow view of this

    def _bind(self, kind: int, endpoint: str) -> zmq.Socket:
        sock = self.zctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.bind(endpoint)
        return sock

    # -- the loop ---------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool], frontend_alive: Callable[[], bool],
            watch_frontends: Callable[[float], None] = lambda now: None) -> None:
        """The loop: requests and replies as they come, upkeep at least every
        MAINTENANCE_INTERVAL under load (IDLE_POLL when idle), until stopped and drained.
        ``watch_frontends`` gets the upkeep's turn too (the daemon restarts dead ones)."""
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        front, back = self.front, self.back
        zygote = self.supervisor.zygote
        zygote_fd = -1
        while True:
            if zygote.fileno() != zygote_fd:  # (re)started: its reports wake the loop
                if zygote_fd >= 0:
                    poller.unregister(zygote_fd)
                zygote_fd = zygote.fileno()
                if zygote_fd >= 0:
                    poller.register(zygote_fd, zmq.POLLIN)
            now = time.monotonic()
            timeout = max(0.0, self.next_wakeup(now) - now)
            events = dict(poller.poll(timeout * 1000.0))
            if zygote_fd in events:
                zygote.read_reports()
                self.reap_workers(time.monotonic())
            if back in events:
                self._drain(back, self.on_worker)
            if front in events:
                self._drain(front, self.on_frontend)
            now = time.monotonic()
            if now - self._last_maintenance >= MAINTENANCE_INTERVAL or self.tasks:
                self._last_maintenance = now
                self.maintain(now)
                watch_frontends(now)
            else:
                self.expire_requests(now)
                self.flush_due_batches(now)
            if not self.stopping and should_stop():
                self.begin_stop(now)
            if self.stopping and self._drained(now, frontend_alive()):
                break

    def _drain(self, sock: zmq.Socket, handle: Callable[[list[bytes], float], None]) -> None:
        """Handle every message waiting on ``sock`` without blocking (bounded per turn)."""
        for _ in range(256):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                handle(frames, time.monotonic())
            except protocol.ProtocolError as exc:
                log.error("dropped a malformed message from %r: %s", frames[0][:16], exc)
            except Exception:  # a message that breaks its handler must not stop the loop
                log.exception("dropped a message from %r that could not be handled",
                              frames[0][:16] if frames else b"")

    def next_wakeup(self, now: float) -> float:
        soonest = now + (MAINTENANCE_INTERVAL if (self.tasks or self.waiters or self.stopping)
                         else IDLE_POLL)
        for mv in self.registry.all_versions():
            if len(mv.batcher):
                when = mv.batcher.next_wakeup(self._any_busy(mv))
                if when is not None and when < soonest:
                    soonest = when
        for worker in self.supervisor.workers.values():
            if worker.state is WorkerState.BUSY and worker.batch_deadline < soonest:
                soonest = worker.batch_deadline
        return soonest

    def maintain(self, now: float) -> None:
        self.finish_tasks()
        self.reap_workers(now)
        self.time_out_workers(now)
        self.expire_requests(now)
        self.reconcile_pools(now)
        self.flush_due_batches(now)
        self.check_waiters(now)
        self.cleanup_retired()

    # -- frontends ----------------------------------------------------------------

    def on_frontend(self, frames: list[bytes], now: float) -> None:
        fid = frames[0]
        kind = protocol.kind_of(frames[1:])
        if kind == protocol.PREDICT:
            self.on_predict(fid, frames, now)
        elif kind == protocol.MANAGE:
            self.on_manage(fid, protocol.parse_manage(frames[2]))
        elif kind == protocol.CANCEL and len(frames) == 3:
            self.on_cancel(fid, frames[2])
        else:
            raise protocol.ProtocolError(f"frontends may not send {kind!r}")

    def on_predict(self, fid: bytes, frames: list[bytes], now: float) -> None:
        route = protocol.parse_route(frames[2])
        try:
            if self.keys is not None:
                self.keys.check(INFERENCE, route.token)
            mv = self.registry.get(route.model, route.version)
            if not any(w.is_serving for w in mv.workers.values()):
                raise NoWorker(f"No worker is available to serve model: {mv.name} "
                               f"version: {mv.version}. Check its workers with "
                               f"GET /models/{mv.name}/{mv.version}.")
            # the frontend's send time, when sane: time in the pipe to here counts as waiting
            sent = route.sent
            arrived = sent if sent is not None and 0.0 <= now - sent < 60.0 else now
            self.admit(mv, now, arrived)
            pending = Pending(route.rid, fid, frames[3:], arrived,
                              arrived + self.queue_timeout(mv, route), route.explain)
            if not mv.batcher.add(pending):
                raise QueueFull(
                    f"Model {mv.name} version {mv.version} has {mv.batcher.capacity} requests "
                    "queued (job_queue_size); retry later.",
                    headers={"Retry-After": "1"})
        except MservdError as exc:
            self.send_error(fid, route.rid, exc)
            return
        self.metrics.version(mv.key).requests.inc()
        self.dispatch(mv, now)

    def admit(self, mv: ModelVersion, now: float, arrived: float) -> None:
        """Refuse at once while requests stand still: this one reached us late, or the
        version's queue head has waited too long — longer than batching asks
        (max_batch_delay) plus max_queue_wait_ms, or four batch times if longer."""
        limit = self.settings.max_queue_wait_ms / 1000.0
        if not limit:
            return
        limit = mv.settings.max_batch_delay / 1000.0 + max(limit, 4 * mv.batch_seconds)
        waited = max(now - arrived, mv.batcher.oldest_wait(now))
        if waited > limit:
            raise QueueFull(
                f"Model {mv.name} version {mv.version} is overloaded: requests have waited "
                f"{waited * 1000:.0f} ms to be served (max_queue_wait_ms allows "
                f"{limit * 1000:.0f}); retry later.", headers={"Retry-After": "1"})

    def on_cancel(self, fid: bytes, rid: bytes) -> None:
        """The client went away: a request still queued is dropped; a running one finishes."""
        for mv in self.registry.all_versions():
            if mv.batcher.remove(lambda p: p.rid == rid and p.fid == fid):
                log.info("dropped request %s of %s/%s: its client went away", rid.decode(),
                         mv.name, mv.version)
                return

    def queue_timeout(self, mv: ModelVersion, route: protocol.Route) -> float:
        """Seconds a request may wait for a worker: its own ask, the default, the model's."""
        limit = float(mv.settings.response_timeout)
        if self.settings.default_request_timeout_ms:
            limit = min(limit, self.settings.default_request_timeout_ms / 1000.0)
        if route.timeout_ms is not None and route.timeout_ms >= 0:
            limit = min(limit, route.timeout_ms / 1000.0)
        return limit

    def on_manage(self, fid: bytes, call: protocol.ManageCall) -> None:
        def respond(reply: Reply) -> None:
            self.front.send_multipart([fid, *protocol.reply(reply.result(call.rid))])

        try:
            if self.keys is not None:
                key = key_for(call.op, call.api)
                if key is not None:
                    self.keys.check(key, call.token)
            result = self.management.call(call.op, call.args, call.token, respond)
        except MservdError as exc:
            respond(Reply.error(exc))
            return
        except Exception as exc:  # a bug in a management verb must not kill the daemon
            log.exception("management call %r failed", call.op)
            respond(Reply(500, error_body(500, "InternalServerException",
                                          f"{type(exc).__name__}: {exc}")))
            return
        if result is not None:
            respond(result)

    def send_error(self, fid: bytes, rid: bytes, exc: MservdError) -> None:
        self.metrics.answered(exc.http_status)
        self.front.send_multipart([fid, *protocol.reply(Reply.error(exc).result(rid))])

    # -- batching and workers -----------------------------------------------------------

    @staticmethod
    def _any_busy(mv: ModelVersion) -> bool:
        return any(w.state is WorkerState.BUSY for w in mv.workers.values())

    def dispatch(self, mv: ModelVersion, now: float) -> None:
        """Hand batches to the version's idle workers, as the batching policy allows."""
        if not len(mv.batcher):
            return
        idle = [w for w in mv.workers.values()
                if w.state is WorkerState.IDLE and not w.stop_requested]
        if not idle:
            return
        any_busy = self._any_busy(mv)
        for worker in idle:
            batch = mv.batcher.take(now, any_busy)
            if not batch:
                return
            self.send_batch(mv, worker, batch, now)
            any_busy = True

    def send_batch(self, mv: ModelVersion, worker: Worker, batch: list[Pending],
                   now: float) -> None:
        vm = self.metrics.version(mv.key)
        for pending in batch:
            worker.batch[pending.rid] = pending
            waited = now - pending.arrived
            vm.queue.observe(waited)
            vm.queue_us.inc(waited * 1e6)
        worker.batch_started = now
        worker.state = WorkerState.BUSY
        worker.batch_deadline = now + mv.settings.response_timeout
        self.back.send_multipart([worker.identity, *protocol.batch(
            (p.rid, p.explain, p.frames) for p in batch)])

    def flush_due_batches(self, now: float) -> None:
        for mv in self.registry.all_versions():
            if len(mv.batcher):
                self.dispatch(mv, now)

    def on_worker(self, frames: list[bytes], now: float) -> None:
        identity = frames[0]
        kind = protocol.kind_of(frames[1:])
        worker = self.supervisor.workers.get(identity)
        if worker is None:
            log.warning("message %r from unknown worker %r dropped", kind, identity)
            return
        if kind == protocol.DONE:
            self.on_done(worker, frames, now)
        elif kind == protocol.CHUNK:  # a streamed part: forward it, the request stays open
            part = protocol.parse_result(frames[2:])
            pending = worker.batch.get(part.rid)
            if pending is not None:
                self.front.send_multipart([pending.fid, *protocol.chunk(part)])
        elif kind == protocol.READY:
            self.on_ready(worker, now)
        elif kind == protocol.METRICS:
            self.metrics.record_handler_samples(protocol.parse_metrics(frames[2]))
        elif kind == protocol.FAILED:
            failure = protocol.parse_failed(frames[2])
            worker.mv.load_error = f"{failure.message}\n{failure.traceback}".strip()
            log.error("worker %s failed to load %s/%s: %s", worker.id, worker.model,
                      worker.version, failure.message)
        else:
            raise protocol.ProtocolError(f"workers may not send {kind!r}")

    def on_ready(self, worker: Worker, now: float) -> None:
        if worker.stop_requested:
            self.supervisor.finish_stop(worker)
            return
        worker.state = WorkerState.IDLE
        self.supervisor.record_ready(worker.mv)
        worker.mv.load_error = None
        log.info("worker %s (pid %s) ready for %s/%s", worker.id, worker.pid, worker.model,
                 worker.version)
        self.dispatch(worker.mv, now)
        self.check_waiters(now)

    def on_done(self, worker: Worker, frames: list[bytes], now: float) -> None:
        batch = worker.batch
        send = self.front.send_multipart
        metrics = self.metrics
        vm = metrics.version((worker.model, worker.version))
        vm.batch.observe(len(batch))
        batch_took = now - worker.batch_started
        vm.handler.observe(batch_took)
        worker.mv.batch_seconds += 0.2 * (batch_took - worker.mv.batch_seconds)
        for result in protocol.parse_done(frames[2:]):
            pending = batch.pop(result.rid, None)
            if pending is not None:
                send([pending.fid, *protocol.reply(result)])
                took = now - pending.arrived
                vm.latency.observe(took)
                vm.latency_us.inc(took * 1e6)
                metrics.answered(protocol.Head.parse(result.head).status)
        for pending in batch.values():
            self.send_error(pending.fid, pending.rid,
                            WorkerDied("The worker returned no answer for this request."))
        batch.clear()
        if worker.stop_requested:
            self.supervisor.finish_stop(worker)
            return
        worker.state = WorkerState.IDLE
        self.dispatch(worker.mv, now)

    def reap_workers(self, now: float) -> None:
        for worker, code in self.supervisor.reap_workers():
            mv = worker.mv
            mv.workers.pop(worker.id, None)
            for pending in worker.batch.values():
                self._retry_or_fail(mv, pending)
            worker.batch.clear()
            if not worker.stop_requested:
                self.supervisor.record_crash(mv, code, now)
                self.metrics.version(mv.key).restarts.inc()
            if self.supervisor.is_failed(mv) and not mv.load_error:
                mv.load_error = "The worker exited while loading the model (exit code 3)."
        self.check_waiters(now)

    def _retry_or_fail(self, mv: ModelVersion, pending: Pending) -> None:
        """A dead worker's request runs once more on another worker, else gets 'Worker died.'"""
        if not pending.retried and self.registry.has_version(mv.name, mv.version) and any(
            w.is_serving for w in mv.workers.values()
        ):
            pending.retried = True
            mv.batcher.push_front(pending)
            return
        self.send_error(pending.fid, pending.rid, WorkerDied())

    def time_out_workers(self, now: float) -> None:
        for worker in list(self.supervisor.workers.values()):
            if worker.state is WorkerState.BUSY and now > worker.batch_deadline:
                self.supervisor.kill_worker(
                    worker, f"batch ran past response_timeout "
                            f"({worker.mv.settings.response_timeout} s)")
                for pending in worker.batch.values():
                    pending.retried = True  # a batch that hangs is not worth running twice
            elif (worker.state is WorkerState.STARTING
                  and now - worker.spawned_at > worker.mv.settings.startup_timeout):
                worker.mv.load_error = (f"The worker did not load the model within "
                                        f"startup_timeout ({worker.mv.settings.startup_timeout} s).")
                self.supervisor.kill_worker(worker, "startup_timeout passed")

    def expire_requests(self, now: float) -> None:
        for mv in self.registry.all_versions():
            for pending in mv.batcher.expire(now):
                waited = now - pending.arrived
                self.send_error(pending.fid, pending.rid, DeadlineExceeded(
                    f"The request waited {waited:.3f} s, past its deadline, in the queue of "
                    f"model {mv.name} version {mv.version}; it was not computed."))

    def reconcile_pools(self, now: float) -> None:
        total = self.total_target_workers()
        for mv in self.registry.all_versions():
            self.supervisor.reconcile(mv, now, total)

    def total_target_workers(self) -> int:
        return sum(mv.target_workers for mv in self.registry.all_versions())

    # -- deferred work ------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], done: Callable[[Future], None], *args: Any) -> None:
        self.tasks.append((self.executor.submit(fn, *args), done))

    def finish_tasks(self) -> None:
        tasks, self.tasks = self.tasks, []
        for future, done in tasks:
            if not future.done():
                self.tasks.append((future, done))
                continue
            try:
                done(future)  # may submit new tasks
            except Exception:  # a bug in a callback must not stop the loop
                log.exception("a background task's callback failed")

    def wait_for(self, waiter: Waiter) -> None:
        self.waiters.append(waiter)
        self.check_waiters(time.monotonic())

    def check_waiters(self, now: float) -> None:
        if not self.waiters:
            return
        keep = []
        for waiter in self.waiters:
            reply = waiter.check(now)
            if reply is None and now > waiter.deadline:
                reply = waiter.on_timeout()
            if reply is None:
                keep.append(waiter)
            else:
                waiter.respond(reply)
        self.waiters = keep

    def retire(self, mv: ModelVersion) -> None:
        """Stop a removed version's workers and answer its queue; files go when workers do."""
        for pending in mv.batcher.drain():
            self.send_error(pending.fid, pending.rid, NoWorker(
                f"Model {mv.name} version {mv.version} was unregistered."))
        for worker in list(mv.workers.values()):
            self.supervisor.stop_worker(worker)
        self.supervisor.forget(mv)
        self.retired.append(mv)

    def cleanup_retired(self) -> None:
        import shutil

        for mv in list(self.retired):
            if not mv.workers:
                self.retired.remove(mv)
                self.executor.submit(shutil.rmtree, mv.model_dir, True)

    # -- health and stopping --------------------------------------------------------

    def registry_changed(self) -> None:
        """Write a snapshot of the registry, once the start-up models are all in."""
        if not self.settings.snapshot or self.startup_pending:
            return
        try:
            snapshot.write(Path(self.settings.log_dir).resolve(), snapshot.capture(self.registry))
        except OSError as exc:
            log.error("could not write a registry snapshot: %s", exc)

    def healthy(self) -> bool:
        if self.startup_pending:
            return False
        for name in self.registry.names():
            mv = self.registry.get(name)
            if mv.live_count() < mv.target_workers:
                return False
        return True

    def begin_stop(self, now: float) -> None:
        log.info("stopping: draining accepted requests (up to %.0f s)", self.settings.drain_timeout)
        self.stopping = True
        self.stop_deadline = now + self.settings.drain_timeout
        if self.on_stopped is not None:
            self.on_stopped()

    def _drained(self, now: float, frontend_alive: bool) -> bool:
        if now > self.stop_deadline:
            log.warning("drain time passed; stopping with requests still open")
            return True
        if frontend_alive:
            return False
        busy = any(w.batch for w in self.supervisor.workers.values())
        queued = any(len(mv.batcher) for mv in self.registry.all_versions())
        return not busy and not queued

    def close(self) -> None:
        now = time.monotonic()
        for mv in self.registry.all_versions():
            for pending in mv.batcher.drain():
                self.send_error(pending.fid, pending.rid, WorkerDied("The server stopped."))
        for worker in list(self.supervisor.workers.values()):
            for pending in worker.batch.values():
                self.send_error(pending.fid, pending.rid, WorkerDied("The server stopped."))
        self.supervisor.terminate_all(grace=5.0)
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.front.close()
        self.back.close()
        self.zctx.term()
        log.info("controller stopped after %.1f s of draining", time.monotonic() - now)
