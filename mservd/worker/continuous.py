"""The worker's loop for a model with ``continuousBatching``: requests join and leave between
steps.

Each turn reads what the controller sent without waiting while sequences run (new requests,
and CANCEL for a client that went away), then calls the handler once with every running
request, TorchServe's way: the handler prefills the new ones and runs one decoding step for
all (``handlers/causal_lm.py``), keeping its state in ``context.cache`` and saying in
``context.stopping_criteria`` which requests are finished. The others' step outputs go out
together as one CHUNK per frontend (when their codec streams), then the finished requests'
answers: straight to the frontends that hold their clients, or through the controller
(``stream_routes.py`` picks, per sequence). A request whose client went away leaves before the
next step, so its slot is free. Steps that tell the controller nothing are reported with
STEPPED at most every ``protocol.STEP_REPORT_INTERVAL``: the controller times a worker's
steps, not its answers.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from mservd import protocol
from mservd.process.lifeline import parent_changed
from mservd.worker import codecs
from mservd.worker.codecs import Call, Codec, encode_answer
from mservd.worker.cores import Threads
from mservd.worker.handler_call import call_handler, describe_failure
from mservd.worker.handler_metrics import ship_metrics
from mservd.worker.stream_routes import StreamRoutes

log = logging.getLogger("mservd.worker")


class SequenceTable:
    """The requests (sequences) a continuous worker runs, in the order they joined: the
    worker's side of what the scheduler calls a worker's running batch."""

    def __init__(self, routes: StreamRoutes | None = None) -> None:
        self.requests: dict[bytes, tuple[protocol.Request, Codec, Call]] = {}
        self.routes = routes if routes is not None else StreamRoutes(None)

    def join(self, request: protocol.Request, codec: Codec, call: Call) -> None:
        self.requests[request.rid] = (request, codec, call)
        self.routes.joined(request)

    def leave(self, rid: bytes, context: Any) -> None:
        self.requests.pop(rid, None)
        self.routes.left(rid)
        cache = getattr(context, "cache", None)
        if isinstance(cache, dict):
            cache.pop(rid.decode(), None)  # TorchServe's handlers key their state by request id


def serve_continuous(sock: Any, handler: Any, context: Any, worker_id: str, parent: int,
                     max_response_size: int, threads: Threads,
                     routes: StreamRoutes | None = None) -> int:
    """Run requests until told to stop; the worker's exit code."""
    running = SequenceTable(routes)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    shipped = told = time.monotonic()
    while True:
        if not poller.poll(0 if running.requests else 1000) and not running.requests:
            if parent_changed(parent):
                log.warning("controller is gone; worker %s exits", worker_id)
                return 0
            ship_metrics(sock, context)
            continue
        while sock.poll(0, zmq.POLLIN):
            frames = sock.recv_multipart()
            kind = frames[0]
            if kind == protocol.STOP:
                log.info("worker %s stopping", worker_id)
                return 0
            if kind == protocol.CANCEL and len(frames) == 2:
                running.leave(frames[1], context)
            elif kind == protocol.BATCH:
                admit(sock, frames[1:], running, context)
            else:
                log.error("worker dropped a message of kind %r", kind[:8])
        if running.requests:
            with threads.batch():
                sent = step(sock, handler, context, running, max_response_size)
            told = report_step(sock, sent, told, running.routes)
        if time.monotonic() - shipped >= 1.0:
            shipped = time.monotonic()
            ship_metrics(sock, context)


def admit(sock: Any, frames: list[bytes], running: SequenceTable, context: Any) -> None:
    """Decode new requests; one that cannot be decoded is answered 400 at once."""
    try:
        requests = protocol.parse_batch(frames)
    except protocol.ProtocolError as exc:
        log.error("worker dropped a malformed batch: %s", exc)
        return
    decoded, refused = codecs.decode(requests, context)
    for request, codec, call in decoded:
        if len(call.rows) != 1:  # a step runs one row of each sequence
            refused.append(protocol.Result(request.rid, *codec.error(
                400, "BadRequest", f"A continuous-batching model takes one input per request; "
                f"this one has {len(call.rows)}.")))
            continue
        running.join(request, codec, call)
    if refused:
        sock.send_multipart(protocol.done(refused))


def report_step(sock: Any, sent: bool, told: float, routes: StreamRoutes) -> float:
    """After a step: say STEPPED (with the gaps between the parts sent straight since) if the
    controller has heard nothing from this worker for ``STEP_REPORT_INTERVAL`` (a step that
    sent it parts or answers said enough); when it was last told."""
    now = time.monotonic()
    if sent:
        return now
    if now - told >= protocol.STEP_REPORT_INTERVAL:
        sock.send_multipart(protocol.stepped(gaps=routes.take_gaps()))
        return now
    return told


def step(sock: Any, handler: Any, context: Any, running: SequenceTable, limit: int) -> bool:
    """One call of the handler with every running request (one row each); whether it told
    the controller anything (parts, answers, or streams begun)."""
    entries = list(running.requests.values())
    context.stopping_criteria = None
    try:
        outputs = call_handler(handler, context, entries)
    except Exception as exc:  # the handler's failure fails the requests it was running
        status, type_, message = describe_failure(exc)
        log.exception("step of requests %s failed (%s): %s",
                      ",".join(r.rid.decode() for r, _, _ in entries), type_, message)
        running.routes.end(sock, [(r, protocol.Result(r.rid, *codec.error(status, type_,
                                                                         message)))
                                  for r, codec, _ in entries])
        for request, _, _ in entries:
            running.leave(request.rid, context)
        return True
    criteria = context.stopping_criteria
    finished: list[tuple[protocol.Request, protocol.Result]] = []
    parts: list[tuple[protocol.Request, protocol.Result]] = []
    for index, (request, codec, call) in enumerate(entries):
        output = outputs[call.first]
        try:
            stops = criteria is None or _stops(criteria[index], output)
        except Exception as exc:  # the handler's criterion fails its request, not the worker
            log.exception("stopping criterion of request %s failed", request.rid.decode())
            finished.append((request, protocol.Result(request.rid, *codec.error(
                500, "InternalServerException",
                f"The handler's stopping criterion failed: {type(exc).__name__}: {exc}"))))
            continue
        if stops:
            finished.append((request, protocol.Result(
                request.rid, *encode_answer(codec, call, [output], context, limit))))
            continue
        part = codec.encode_part(call, output, context, limit)
        if part is not None:
            parts.append((request, protocol.Result(request.rid, *part)))
    # the step's parts before the answers that end their streams
    told, cut = running.routes.send(sock, parts, finished)
    for request, _ in finished:
        running.leave(request.rid, context)
    if cut:  # their frontend took no more: they end here, through the controller
        log.warning("requests %s end: their frontend takes no more parts",
                    ",".join(r.rid.decode() for r in cut))
        errors = []
        for request in cut:
            codec = running.requests[request.rid][1]
            running.leave(request.rid, context)
            errors.append(protocol.Result(request.rid, *codec.error(
                503, "ServiceUnavailableException",
                "The frontend holding this stream took no more of its parts.")))
        sock.send_multipart(protocol.done(errors))
        told = True
    return told


def _stops(criterion: Any, output: Any) -> bool:
    """Whether a request's stopping criterion ends it with this output: True ends it, False
    keeps it running, and None ends it too (TorchServe sends no ``ts_stream_next`` then)."""
    stop = criterion(output)
    return stop is None or bool(stop)
