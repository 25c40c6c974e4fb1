"""The controller: the one process that owns state, and the loop that moves every request.

Two ROUTER sockets: frontends (HTTP and gRPC processes) send requests and management calls on
one, backend workers talk on the other. Each turn of the loop waits until the next deadline,
handles what arrived (``on_predict``, ``on_manage``, ``on_worker``), then reaps and times out
workers, and lets the scheduler expire and send what is due. The controller decides nothing
about requests itself: the scheduler (``scheduler.py``) returns actions and :meth:`perform`
carries them out; the supervisor runs workers' lives. Nothing blocks: archive unpacking runs on
a helper thread whose result the loop picks up, and replies that must wait (a synchronous
register or scale) are kept as ``Waiter``s and answered when they can be.

Per request the controller reads only the route header and forwards payload frames as they are;
the answers of one turn leave at its end, one message per frontend (:meth:`send_answers`). A
worker that could send its answers to their frontends itself says so with ANSWERED: the
controller does its bookkeeping and forwards nothing (``frontend_links.py``). A worker left
idle may be lent to a frontend, which then sends it requests itself (``leases.py``): the
controller hears of those afterwards (SERVED).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import zmq

from mservd import protocol
from mservd.auth import INFERENCE, MANAGEMENT, KeyStore
from mservd.config import Settings, read_model_metrics
from mservd.controller import snapshot
from mservd.controller.graphs import Graphs
from mservd.controller.management import Management
from mservd.controller.supervisor import Supervisor, describe_exit
from mservd.controller.waiter import Waiter
from mservd.controller.workflows import Workflows
from mservd.controller.zygote_client import Zygote
from mservd.core.leases import Lend, Recall, Revoke
from mservd.core.metrics import Metrics
from mservd.core.registry import ModelVersion, Registry
from mservd.core.scheduler import (
    SHADOW,
    Action,
    CancelRunning,
    Forward,
    KillWorker,
    Refuse,
    Scheduler,
    SendBatch,
)
from mservd.errors import MservdError, error_body
from mservd.protocol import Reply

log = logging.getLogger(__name__)

# plain ints: pyzmq's flag enums cost an enum operation each time they are combined
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
MAINTENANCE_INTERVAL = 0.1  # seconds between reaping/timeout sweeps under load
IDLE_POLL = 1.0
# Who asked, for the controller's own questions to a handler (describe's customized metadata):
# never a frontend's name (ZeroMQ's begin with a zero byte, reply endpoints with ipc://)
OWN = b"controller"


# The keys a controller verb may be called with, decided by the verb: the API a frontend says a
# call came from only picks among them. Verbs not listed need the management key.
VERB_KEYS: dict[str, tuple[str, ...]] = {
    "ping": (), "metrics": (), "token": (),  # open; "token" checks the API key itself
    "list": (INFERENCE, MANAGEMENT),  # GET /v1/models (inference) and GET /models
    "v2_model_ready": (INFERENCE,), "v2_model_metadata": (INFERENCE,),
    # a frontend's check of a token before it reads a body: a prediction's (inference key), or
    # the dashboard's key form and page (management key)
    "authorize": (INFERENCE, MANAGEMENT),
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
                 run_dir: Path, keys: KeyStore | None, gpu_count: int,
                 zygote: Zygote | None = None) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.keys = keys
        self.gpu_count = gpu_count
        self.frontend_endpoint = frontend_endpoint
        self.backend_endpoint = backend_endpoint
        self.zctx: zmq.Context | None = None
        self.front: Any = None  # the ROUTER sockets, bound by start()
        self.back: Any = None
        self.registry = Registry()
        self.supervisor = Supervisor(
            backend_endpoint,
            Path(settings.log_dir),
            gpu_count,
            send_stop=lambda w: self.back.send_multipart([w.identity, *protocol.stop()]),
            worker_spec_extra={"max_response_size": settings.max_response_size,
                               "log_level": settings.log_level,
                               "log_format": settings.log_format,
                               "install_py_dep_per_model": settings.install_py_dep_per_model,
                               # a job socket (leases.py)
                               "lendable": settings.lend_idle_workers,
                               "decode_input_request": settings.decode_input_request,
                               "model_metrics": read_model_metrics(settings.metrics_config)
                               if settings.metrics_config else None},
            zygote=zygote,
        )
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mservd-unpack")
        self.tasks: list[tuple[Future, Callable[[Future], None]]] = []
        self.waiters: list[Waiter] = []
        self.answers: dict[bytes, list[protocol.Result]] = {}  # per frontend, this turn's
        self.parts: dict[bytes, list[protocol.Result]] = {}  # ... and its streamed parts
        self.questions: dict[bytes, Callable[[protocol.Result], None]] = {}  # ask_handler's
        self.loading: set[tuple[str, str]] = set()
        self.retired: list[ModelVersion] = []
        self.startup_pending = 0
        self.stopping = False
        self.stop_deadline = 0.0
        self._last_maintenance = 0.0
        self.on_stopped: Callable[[], None] | None = None
        self.metrics = Metrics()
        self.started_at = time.time()
        self.scheduler = Scheduler(settings, self.registry, self.metrics)
        self.management = Management(self)  # the management verbs, on a narrow view of this
        self.workflows = Workflows(self, self.management.store, self.management.limits)
        self.graphs = Graphs(self)  # /wfpredict runs
        self._asked = itertools.count(1)

    def start(self) -> None:
        """Bind the two sockets and start the supervisor's zygote."""
        self.zctx = zmq.Context()
        self.front = self._bind(zmq.ROUTER, self.frontend_endpoint)
        self.back = self._bind(zmq.ROUTER, self.backend_endpoint)
        self.scheduler.leases.enabled = self.settings.lend_idle_workers
        self.scheduler.leases.key = None if self.keys is None else self.keys.inference_check()
        self.scheduler.leases.reply_prefix = protocol.reply_prefix(self.backend_endpoint)
        self.supervisor.start()

    def _bind(self, kind: int, endpoint: str) -> zmq.Socket:
        assert self.zctx is not None  # bound once, at start
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
            self.send_answers()
            if zygote.fileno() != zygote_fd:  # (re)started: its reports wake the loop
                if zygote_fd >= 0:
                    poller.unregister(zygote_fd)
                zygote_fd = zygote.fileno()
                if zygote_fd >= 0:
                    poller.register(zygote_fd, zmq.POLLIN)
            now = time.monotonic()
            due = self.scheduler.next_wakeup(self.graphs.next_deadline(), now)  # when tick
            # (or a workflow run) has work, soonest
            timeout = max(0.0, min(due, self.upkeep_by(now)) - now)
            events = dict(poller.poll(int(timeout * 1000.0)))  # pyzmq truncates to ms anyway
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
            elif now >= due:  # what came this turn was dispatched as it came
                self.perform(self.scheduler.tick(now))
                self.graphs.tick(now)
            if not self.stopping and should_stop():
                self.begin_stop(now)
            if self.stopping and self._drained(now, frontend_alive()):
                self.send_answers()  # this turn's, to frontends still there
                break

    def _drain(self, sock: zmq.Socket, handle: Callable[[list[bytes], float], None]) -> None:
        """Handle every message waiting on ``sock`` without blocking (bounded per turn). The
        socket is asked whether one waits: cheaper than the zmq.Again a recv would raise."""
        for _ in range(256):
            if not cast(int, sock.getsockopt(EVENTS)) & POLLIN:
                return
            try:
                frames = sock.recv_multipart(NOBLOCK)
            except zmq.Again:
                return
            try:
                handle(frames, time.monotonic())
            except protocol.ProtocolError as exc:
                log.error("dropped a malformed message from %r: %s", frames[0][:16], exc)
            except Exception:  # a message that breaks its handler must not stop the loop
                log.exception("dropped a message from %r that could not be handled",
                              frames[0][:16] if frames else b"")

    def upkeep_by(self, now: float) -> float:
        """When the loop wakes for upkeep if nothing comes: soon while something waits on it."""
        return now + (MAINTENANCE_INTERVAL if (self.tasks or self.waiters or self.stopping)
                      else IDLE_POLL)

    def maintain(self, now: float) -> None:
        self.finish_tasks()
        self.reap_workers(now)
        self.supervisor.time_out_starting(now)
        self.reconcile_pools(now)
        self.perform(self.scheduler.tick(now))
        self.review_traffic(now)
        self.graphs.tick(now)
        self.check_waiters(now)
        self.cleanup_retired()

    def review_traffic(self, now: float) -> None:
        """Versions whose 5xx rate passed their traffic policy's bound lose their traffic for
        a cooldown (core/traffic.py): said in the log and the dashboard's events."""
        for name, version, rate in self.scheduler.review_traffic(now):
            cooldown = self.scheduler.traffic.health_of((name, version)).tripped_until
            message = (f"traffic of model {name} version {version} tripped: {rate:.0%} of its "
                       f"answers were 5xx; it gets none for {(cooldown or now) - now:.1f} s, "
                       "then its weight back")
            log.warning(message)
            self.metrics.event("traffic tripped", message, model=name, version=version)

    def perform(self, actions: Sequence[Action]) -> None:
        """Carry out what the scheduler decided: the controller's only sends of requests.
        Answers wait in :attr:`answers` for the end of the loop's turn."""
        for action in actions:
            if type(action) is Forward:
                self.answer(action.fid, action.result)
            elif type(action) is SendBatch:
                self.back.send_multipart([action.worker.identity, *protocol.batch(
                    (p.rid, p.kind, p.fid, p.frames, p.server_headers)
                    for p in action.requests)])
            elif type(action) is Refuse:
                self.answer(action.fid, Reply.error(action.error).result(action.rid))
            elif type(action) is KillWorker:
                self.supervisor.kill_worker(action.worker, action.reason)
            elif type(action) is CancelRunning:
                self.back.send_multipart([action.worker.identity, *protocol.cancel(action.rid)])
            elif type(action) is Lend:
                self.front.send_multipart([action.fid, *protocol.lease(action.lease)])
            elif type(action) is Recall:
                self.back.send_multipart([action.worker.identity, *protocol.recall()])
            elif type(action) is Revoke:
                self.front.send_multipart([action.fid, *protocol.revoke(action.jobs,
                                                                        action.lost)])

    def answer(self, fid: bytes, result: protocol.Result) -> None:
        """Queue a final answer for frontend ``fid``: all its answers of one turn of the loop
        leave as one REPLY (:meth:`send_answers`). A shadow copy's answer is counted and
        dropped here: no frontend asked for it."""
        if fid == SHADOW:
            self.shadow_answered(result)
            return
        self._queue(self.answers, fid, result)

    def shadow_answered(self, result: protocol.Result) -> None:
        """Count a shadow copy's answer by its outcome; its version counted it as a request
        of its own already (status and latency)."""
        status = protocol.Head.parse(result.head).status
        key = self.scheduler.shadows.pop(result.rid, None)
        if key is not None:
            self.metrics.shadowed(*key, "ok" if status < 400 else "error")

    @staticmethod
    def _queue(box: dict[bytes, list[protocol.Result]], fid: bytes,
               result: protocol.Result) -> None:
        waiting = box.get(fid)
        if waiting is None:
            box[fid] = [result]
        else:
            waiting.append(result)

    def send_answers(self) -> None:
        """Each frontend's streamed parts of this turn as one CHUNK, then its answers as one
        REPLY: a stream's last parts always reach the frontend before its end. Answers to the
        controller's own questions go to their askers first (who may answer a frontend, or
        ask again: a workflow's next node, refused at once, answers OWN anew — so until none
        is left; OWN is never sent to a frontend)."""
        self.parts.pop(OWN, None)
        while OWN in self.answers:
            for result in self.answers.pop(OWN):
                asker = self.questions.pop(result.rid, None)
                if asker is not None:
                    asker(result)
        if self.parts:
            parts, self.parts = self.parts, {}
            for fid, results in parts.items():
                self.front.send_multipart([fid, *protocol.chunks(results)])
        if self.answers:
            answers, self.answers = self.answers, {}
            for fid, results in answers.items():
                self.front.send_multipart([fid, *protocol.replies(results)])

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
        elif kind == protocol.OVERDUE and len(frames) == 3:
            self.on_overdue(fid, frames[2].decode("ascii", "replace"))
        else:
            raise protocol.ProtocolError(f"frontends may not send {kind!r}")

    def on_predict(self, fid: bytes, frames: list[bytes], now: float) -> None:
        """The requests a frontend read in one turn of its loop: each queued (or refused),
        then each version they went to dispatched once, so they may share a batch."""
        queued: dict[int, ModelVersion] = {}
        try:
            for route, parts in protocol.parse_predictions(frames[2:]):
                if self.keys is not None:
                    try:
                        self.keys.check(INFERENCE, route.token)
                    except MservdError as exc:
                        self.perform([self.scheduler.refuse(fid, route.rid, exc)])
                        continue
                if route.workflow:
                    self.start_graph(fid, route, parts, now)
                    continue
                try:
                    mv, refused = self.scheduler.enqueue(fid, route, parts, now)
                except Exception as exc:  # a bug costs this request its result, never its
                    # answer, nor the answers of the requests that came in its message
                    log.exception("request %s could not be queued", route.rid.decode(
                        "ascii", "replace"))
                    mv, refused = None, [self.scheduler.refuse(fid, route.rid, MservdError(
                        f"The request could not be queued: {type(exc).__name__}: {exc}"))]
                self.perform(refused)  # a refusal, or a shadow copy's dispatch
                if mv is not None:
                    queued[id(mv)] = mv
        finally:
            for mv in queued.values():
                self.perform(self.scheduler.dispatch(mv, now))

    def start_graph(self, fid: bytes, route: protocol.Route, parts: list[bytes],
                    now: float) -> None:
        """A /wfpredict request: its workflow's run starts (graphs.py), or it is refused."""
        try:
            self.graphs.start(fid, route, parts, now)
        except MservdError as exc:
            self.perform([self.scheduler.refuse(fid, route.rid, exc, model=route.model)])
        except Exception as exc:  # a bug costs this run its result, never its answer
            log.exception("workflow run %s could not start", route.rid.decode("ascii", "replace"))
            self.perform([self.scheduler.refuse(fid, route.rid, MservdError(
                f"The workflow run could not start: {type(exc).__name__}: {exc}"))])

    def on_cancel(self, fid: bytes, rid: bytes) -> None:
        """The client went away: a request still queued is dropped; a running one finishes."""
        if self.graphs.cancel(fid, rid, time.monotonic()):
            log.info("dropped workflow run %s: its client went away", rid.decode())
            return
        mv, actions = self.scheduler.cancel(fid, rid, time.monotonic())
        self.perform(actions)
        if mv is not None:
            log.info("dropped request %s of %s/%s: its client went away", rid.decode(),
                     mv.name, mv.version)

    def on_overdue(self, fid: bytes, jobs: str) -> None:
        """A batch frontend ``fid`` sent the worker at ``jobs`` on a lease hung past the
        response timeout: the worker is killed, as one whose batch of ours hangs is."""
        worker = self.scheduler.leases.borrowed(fid, jobs, self.supervisor.workers.values())
        if worker is not None:
            self.supervisor.kill_worker(worker, "a batch sent it on a lease ran past "
                                                f"response_timeout ({worker.mv.settings.response_timeout} s)")

    def on_manage(self, fid: bytes, call: protocol.ManageCall) -> None:
        def respond(reply: Reply) -> None:
            self.answer(fid, reply.result(call.rid))

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

    # -- workers --------------------------------------------------------------------

    def on_worker(self, frames: list[bytes], now: float) -> None:
        identity = frames[0]
        kind = protocol.kind_of(frames[1:])
        worker = self.supervisor.workers.get(identity)
        if worker is None:
            log.warning("message %r from unknown worker %r dropped", kind, identity)
            return
        if kind == protocol.DONE or kind == protocol.ANSWERED:
            answered = kind == protocol.ANSWERED  # the worker sent the frontends the answers
            results = (protocol.parse_answered(frames[2:]) if answered
                       else protocol.parse_results(frames[2:]))
            self.perform(self.scheduler.finished(worker, results, now, answered))
            if worker.stop_requested and not self.scheduler.is_busy(worker):
                self.supervisor.finish_stop(worker)
        elif kind == protocol.SERVED:  # batches frontends sent it on a lease
            for batch in protocol.parse_served(frames[2:]):
                self.perform(self.scheduler.served(worker, batch))
        elif kind == protocol.RETURNED:  # a recalled worker is ours again
            self.perform(self.scheduler.returned(worker, now, used=frames[2:3] == [b"1"]))
            if worker.stop_requested and not self.scheduler.is_busy(worker):
                self.supervisor.finish_stop(worker)
        elif kind == protocol.CHUNK:  # streamed parts: forwarded, their requests stay open
            for part in protocol.parse_results(frames[2:]):
                fid = self.scheduler.progress(worker, part.rid, now, part.head)
                if fid is not None and fid != SHADOW:
                    self._queue(self.parts, fid, part)
        elif kind == protocol.STEPPED:  # a continuous worker's steps go on, unstreamed
            self.scheduler.stepped(worker, now, *protocol.parse_stepped(frames[2:]))
        elif kind == protocol.READY:
            if self.supervisor.on_ready(worker):
                worker.job_endpoint = protocol.parse_ready(frames[2])
                worker.mv.load_error = None
                log.info("worker %s (pid %s) ready for %s/%s", worker.id, worker.pid,
                         worker.model, worker.version)
                self.perform(self.scheduler.dispatch(worker.mv, now))
                self.check_waiters(now)
        elif kind == protocol.METRICS:
            self.metrics.record_worker_samples(worker, protocol.parse_metrics(frames[2]))
        elif kind == protocol.FAILED:
            failure = protocol.parse_failed(frames[2])
            worker.mv.load_error = f"{failure.message}\n{failure.traceback}".strip()
            log.error("worker %s failed to load %s/%s: %s", worker.id, worker.model,
                      worker.version, failure.message)
        else:
            raise protocol.ProtocolError(f"workers may not send {kind!r}")

    def ask_handler(self, mv: ModelVersion, frames: list[bytes],
                    answer: Callable[[protocol.Result], None]) -> None:
        """Put a question of the controller's own (``frames``: meta and payloads) to the
        version's handler, queued like a request; ``answer`` gets its result, or the error it
        is refused with. Raises at once what a request would be refused with."""
        rid = f"ask-{next(self._asked)}".encode()
        self.questions[rid] = answer
        try:
            self.perform(self.scheduler.ask(mv, OWN, rid, frames, time.monotonic()))
        except MservdError:
            del self.questions[rid]
            raise

    def reap_workers(self, now: float) -> None:
        for worker in self.supervisor.reap_workers(now):
            if not worker.stop_requested:
                self.metrics.version(worker.mv.key).worker_died()
                self.metrics.event("worker died", f"worker {worker.id} (pid {worker.pid}) "
                                   f"{describe_exit(worker.proc.returncode)}",
                                   model=worker.model, version=worker.version)
            self.perform(self.scheduler.worker_lost(worker, now))
        self.check_waiters(now)

    def reconcile_pools(self, now: float) -> None:
        total = self.total_target_workers()
        for mv in self.registry.all_versions():
            self.supervisor.reconcile(mv, now, total, self.scheduler.is_busy)

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
        self.perform(self.scheduler.retire(mv))
        for worker in list(mv.workers.values()):
            self.perform(self.scheduler.leases.take_back(worker))
            self.supervisor.stop_worker(worker, self.scheduler.is_busy(worker))
        self.supervisor.forget(mv)
        self.retired.append(mv)

    def inference_key_changed(self) -> None:
        """A rotated inference key: no frontend may check tokens against the old one."""
        assert self.keys is not None
        self.scheduler.leases.key = self.keys.inference_check()
        self.perform(self.scheduler.leases.of_model(None))

    def default_changed(self, name: str) -> None:
        """Requests for ``name`` naming no version now go elsewhere: no lent worker of the
        model may take them any longer."""
        self.perform(self.scheduler.leases.of_model(name))

    def cleanup_retired(self) -> None:
        import shutil

        for mv in list(self.retired):
            if not mv.workers:
                self.retired.remove(mv)
                if mv.owns_model_dir:
                    self.executor.submit(shutil.rmtree, mv.model_dir, True)

    # -- health and stopping --------------------------------------------------------

    def registry_changed(self) -> None:
        """Write a snapshot of the registry, once the start-up models are all in."""
        if not self.settings.snapshot or self.startup_pending:
            return
        try:
            document = snapshot.capture(self.registry, self.workflows.entries)
            snapshot.write(Path(self.settings.log_dir).resolve(), document)
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
        return self.scheduler.idle()

    def close(self) -> None:
        now = time.monotonic()
        if self.front is not None:
            self.perform(self.scheduler.close("The server stopped."))
            self.send_answers()
        self.supervisor.terminate_all(grace=5.0)
        self.executor.shutdown(wait=True, cancel_futures=True)
        if self.zctx is not None:
            self.front.close()
            self.back.close()
            self.zctx.term()
        log.info("controller stopped after %.1f s of draining", time.monotonic() - now)
