"""The backend worker: one OS process serving one model version.

It loads the handler once (``initialize``), tells the controller it is ready (or why it could
not load, then exits with code 3), and then runs batches until told to stop. It knows its model,
its device and its socket, nothing else. A batch that raises fails only itself; the worker lives
on. The worker exits by itself when its parent (the zygote, which dies with the controller) goes
away: parent-death signal, and a ppid check each second, so no worker outlives its daemon.

The supervisor's zygote forks each worker and calls :func:`run` with the spec it was sent;
``python -m mservd.worker SPEC_JSON`` (``__main__.py``) runs one in a fresh interpreter, for
debugging a handler.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback

import zmq

from mservd import protocol
from mservd.process.lifeline import EXIT_LOAD_FAILED, die_with_parent, parent_changed
from mservd.process.log_format import log_to_stderr
from mservd.specs import WorkerSpec
from mservd.worker.allocator import keep_freed_memory
from mservd.worker.batches import Batches
from mservd.worker.continuous import serve_continuous
from mservd.worker.cores import Threads
from mservd.worker.frontend_links import FrontendLinks
from mservd.worker.handler_metrics import ship_metrics
from mservd.worker.job_socket import JobSocket
from mservd.worker.loading import load, set_threads
from mservd.worker.stdout import TaggedStream
from mservd.worker.stream_routes import StreamRoutes

log = logging.getLogger("mservd.worker")
POLL_MS = 1000
LEASED_PER_TURN = 8  # leased batches run before the controller's socket is read again
SERVED_WAIT = 0.001  # seconds a worker with nothing to do waits before it reports leased
# batches to the controller (they go at most batches.SERVED_EVERY late while it is busy)
METRICS_INTERVAL = 1.0  # seconds between shipments of handler metrics to the controller


def serve(spec: WorkerSpec) -> int:
    parent = os.getppid()
    zctx = zmq.Context()
    sock = zctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, spec.worker_id.encode())
    sock.connect(spec.endpoint)
    began = time.monotonic()
    try:
        handler, context = load(spec)
    except BaseException as exc:  # any load failure must reach the register call
        tb = traceback.format_exc()
        log.error("loading %s failed:\n%s", spec.model_name, tb)
        sock.send_multipart(protocol.failed(protocol.LoadFailure(f"{type(exc).__name__}: {exc}",
                                                                 tb)))
        time.sleep(0.2)  # let the message leave before the context goes
        sock.close(linger=1000)
        return EXIT_LOAD_FAILED
    threads = Threads(spec.threads)
    links = FrontendLinks(zctx, spec.endpoint)
    batches = Batches(sock, handler, context, links, spec.max_response_size, threads)
    if spec.continuous_batching:  # the model's settings say so: the scheduler agrees
        keep_freed_memory()  # a step's large tensors, every step: not faulted in each time
        sock.send_multipart(protocol.ready(os.getpid()))
        _log_ready(spec, began)
        return serve_continuous(sock, handler, context, spec.worker_id, parent,
                                spec.max_response_size, threads,
                                StreamRoutes(links if spec.direct_streams else None))
    jobs = JobSocket.bind(spec.endpoint) if spec.lendable else None
    sock.send_multipart(protocol.ready(os.getpid(), None if jobs is None else jobs.endpoint))
    _log_ready(spec, began)
    try:
        return _serve_batches(spec, sock, jobs, batches, parent)
    finally:
        if jobs is not None:
            jobs.close()


def _log_ready(spec: WorkerSpec, began: float) -> None:
    log.info("worker %s ready: model %s version %s loaded in %.2f s", spec.worker_id,
             spec.model_name, spec.version, time.monotonic() - began)


def _serve_batches(spec: WorkerSpec, sock, jobs: JobSocket | None, batches: Batches,
                   parent: int) -> int:
    """Batches from the controller and, when lent, from a frontend, until told to stop."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if jobs is not None:
        poller.register(jobs.listener, zmq.POLLIN)
    shipped = time.monotonic()
    while True:
        report_by = batches.report_by()
        wait = POLL_MS if report_by is None else max(
            0.0, min(SERVED_WAIT, report_by - time.monotonic())) * 1000.0
        ready = dict(poller.poll(int(wait)))  # pyzmq truncates to whole ms anyway
        if report_by is not None and (not ready or time.monotonic() >= report_by):
            batches.report()
        if not ready:
            if report_by is not None:
                continue
            if parent_changed(parent):
                log.warning("controller is gone; worker %s exits", spec.worker_id)
                return 0
            ship_metrics(sock, batches.context)
            continue
        if sock in ready:
            frames = sock.recv_multipart()
            kind = frames[0]
            if kind == protocol.STOP:
                if jobs is not None:  # sent before the lease ended
                    jobs.run(batches, poller, None, None)
                batches.report()
                log.info("worker %s stopping", spec.worker_id)
                return 0
            if kind == protocol.BATCH:
                batches.from_controller(frames)
            elif kind == protocol.RECALL:  # the controller's batches next: ours first
                if jobs is not None:
                    jobs.run(batches, poller, None, None)
                batches.report()
                sock.send_multipart(protocol.returned(batches.leased_since_ours > 0))
                batches.leased_since_ours = 0
            else:
                log.error("worker dropped a message of kind %r", kind[:8])
        if jobs is not None:
            jobs.run(batches, poller, ready, LEASED_PER_TURN)
        if time.monotonic() - shipped >= METRICS_INTERVAL:
            shipped = time.monotonic()
            ship_metrics(sock, batches.context)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run(WorkerSpec.from_json(argv[0]))


def run(spec: WorkerSpec) -> int:
    """Be the worker ``spec`` describes, in this process (a fresh one or a zygote's fork)."""
    log_to_stderr(spec.log_level, spec.log_format)
    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the daemon, which stops us
    log_format = spec.log_format
    sys.stdout = TaggedStream(sys.stdout, os.getpid(), log_format)
    sys.stderr = TaggedStream(sys.stderr, os.getpid(), log_format, logging.WARNING)
    set_threads(spec.threads)
    if spec.model_dir and spec.model_dir not in sys.path:
        sys.path.insert(0, spec.model_dir)
    return serve(spec)

