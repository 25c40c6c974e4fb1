"""The worker's loop for a model with ``continuousBatching``: requests join and leave between
steps.

Each turn reads what the controller sent without waiting while sequences run (new requests,
and CANCEL for a client that went away), then calls the handler once with every running
request, TorchServe's way: the handler prefills the new ones and runs one decoding step for
all (``handlers/causal_lm.py``), keeping its state in ``context.cache`` and saying in
``context.stopping_criteria`` which requests are finished. The others' step outputs go back
together as one CHUNK (when their codec streams), then the finished requests' answers as one
DONE. A request whose client went away leaves before the next step, so its slot is free.
Steps that send nothing (non-streamed generations) are reported with STEPPED at most every
``protocol.STEP_REPORT_INTERVAL``: the controller times a worker's steps, not its answers.
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

log = logging.getLogger("mservd.worker")


class SequenceTable:
    """The requests (sequences) a continuous worker runs, in the order they joined: the
    worker's side of what the scheduler calls a worker's running batch."""

    def __init__(self) -> None:
        self.requests: dict[bytes, tuple[protocol.Request, Codec, Call]] = {}

    def join(self, request: protocol.Request, codec: Codec, call: Call) -> None:
        self.requests[request.rid] = (request, codec, call)

    def leave(self, rid: bytes, context: Any) -> None:
        self.requests.pop(rid, None)
        cache = getattr(context, "cache", None)
        if isinstance(cache, dict):
            cache.pop(rid.decode(), None)  # TorchServe's handlers key their state by request id


def serve_continuous(sock: Any, handler: Any, context: Any, worker_id: str, parent: int,
                     max_response_size: int, threads: Threads) -> int:
    """Run requests until told to stop; the worker's exit code."""
    running = SequenceTable()
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
            told = report_step(sock, sent, told)
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


def report_step(sock: Any, sent: bool, told: float) -> float:
    """After a step: say STEPPED if the controller has heard nothing from this worker for
    ``STEP_REPORT_INTERVAL`` (a step that sent parts or answers said enough); when it was last
    told."""
    now = time.monotonic()
    if sent:
        return now
    if now - told >= protocol.STEP_REPORT_INTERVAL:
        sock.send_multipart(protocol.stepped())
        return now
    return told


def step(sock: Any, handler: Any, context: Any, running: SequenceTable, limit: int) -> bool:
    """One call of the handler with every running request (one row each); whether it sent
    the controller anything (parts or answers)."""
    entries = list(running.requests.values())
    context.stopping_criteria = None
    try:
        outputs = call_handler(handler, context, entries)
    except Exception as exc:  # the handler's failure fails the requests it was running
        status, type_, message = describe_failure(exc)
        log.exception("step of requests %s failed (%s): %s",
                      ",".join(r.rid.decode() for r, _, _ in entries), type_, message)
        sock.send_multipart(protocol.done(
            protocol.Result(r.rid, *codec.error(status, type_, message))
            for r, codec, _ in entries))
        for request, _, _ in entries:
            running.leave(request.rid, context)
        return True
    criteria = context.stopping_criteria
    finished, parts = [], []
    for index, (request, codec, call) in enumerate(entries):
        output = outputs[call.first]
        try:
            stops = criteria is None or _stops(criteria[index], output)
        except Exception as exc:  # the handler's criterion fails its request, not the worker
            log.exception("stopping criterion of request %s failed", request.rid.decode())
            finished.append(protocol.Result(request.rid, *codec.error(
                500, "InternalServerException",
                f"The handler's stopping criterion failed: {type(exc).__name__}: {exc}")))
            running.leave(request.rid, context)
            continue
        if stops:
            finished.append(protocol.Result(request.rid,
                                            *encode_answer(codec, call, [output], context, limit)))
            running.leave(request.rid, context)
            continue
        part = codec.encode_part(call, output, context, limit)
        if part is not None:
            parts.append(protocol.Result(request.rid, *part))
    if parts:  # the step's parts in one message, before the answers that end their streams
        sock.send_multipart(protocol.chunks(parts))
    if finished:
        sock.send_multipart(protocol.done(finished))
    return bool(parts or finished)


def _stops(criterion: Any, output: Any) -> bool:
    """Whether a request's stopping criterion ends it with this output: True ends it, False
    keeps it running, and None ends it too (TorchServe sends no ``ts_stream_next`` then)."""
    stop = criterion(output)
    return stop is None or bool(stop)
