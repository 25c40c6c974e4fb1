"""Running the batches a worker gets, from the controller or on a lease, and sending their
answers where they go: to the frontends that asked, or back through the controller."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

from mservd import protocol
from mservd.worker import codecs
from mservd.worker.codecs import CODECS, Call, encode_answer
from mservd.worker.cores import Threads
from mservd.worker.frontend_links import FrontendLinks
from mservd.worker.handler_call import call_handler, describe_failure
from mservd.worker.stdout import tag_output

log = logging.getLogger("mservd.worker")
LINK_WAIT = 1.0  # seconds a leased batch's answer waits for its frontend's connection
SERVED_EVERY = 0.01  # seconds: leased batches are reported to the controller at most this late
# while busy: one wake-up of the controller per report, not per request


class ChunkRoute:
    """Where the running batch's streamed parts go: to the controller, which forwards them
    (each such request goes into ``streamed``: its final answer must follow the parts there),
    or, for a batch a frontend sent on a lease (``leased_to``), straight to that frontend."""

    def __init__(self, sock, links: FrontendLinks | None = None) -> None:
        self.sock = sock
        self.links = links
        self.leased_to: bytes | None = None
        self.streamed: set[bytes] = set()

    def send(self, part: protocol.Result) -> None:
        if self.leased_to is not None and self.links is not None:
            if not self.links.send(self.leased_to, protocol.chunks([part]), LINK_WAIT):
                log.warning("a streamed part of request %s could not reach its frontend",
                            part.rid.decode(errors="replace"))
            return
        self.streamed.add(part.rid)
        self.sock.send_multipart(protocol.chunks([part]))


def attach_stream(context, route: ChunkRoute, max_response_size: int) -> None:
    """Let the handler stream: ``send_intermediate`` sends one CHUNK for a request at once.

    Set once per worker; a plain batch pays nothing for it. The chunk is encoded like a final
    answer of its request's protocol.
    """
    def send_chunk(idx: int, item: Any) -> None:
        call, codec = context.calls[idx]
        rid = context.request_ids[idx].encode()
        part = codec.encode_part(Call(call.rows, idx, call.state), item, context,
                                 max_response_size)
        if part is not None:
            route.send(protocol.Result(rid, *part))

    context.stream_callback = send_chunk


def answer_batch(handler, context, requests: list[protocol.Request], max_response_size: int,
                 raise_failure: bool = False) -> list[protocol.Result]:
    """Run a batch's requests through the handler; one answer per request.

    Each request's codec turns it into rows of the handler's batch and the handler's outputs
    for those rows into its answer. A request whose payload cannot be decoded is answered 400
    at once and left out; a handler that fails fails its batch only (``raise_failure``: its
    exception is raised instead, for ``mservd run-handler`` to show).
    """
    running, results = codecs.decode(requests, context)
    if not running:
        return results
    ids = ",".join(request.rid.decode() for request, _, _ in running)
    tag_output(ids)
    try:
        outputs = call_handler(handler, context, running)
    except (Exception, SystemExit) as exc:  # the handler's failure fails this batch only
        if raise_failure:
            raise
        status, type_, message = describe_failure(exc)
        log.exception("batch of requests %s failed (%s): %s", ids, type_, message)
        for request, codec, _ in running:
            results.append(protocol.Result(request.rid, *codec.error(status, type_, message)))
        return results
    for request, codec, call in running:
        mine = outputs[call.first:call.first + len(call.rows)]
        results.append(protocol.Result(request.rid,
                                       *encode_answer(codec, call, mine, context,
                                                     max_response_size)))
    return results


def _failed_batch(frames: list[bytes], exc: Exception) -> list[bytes] | None:
    """A DONE message answering every request of a batch 500; None if it cannot be read."""
    try:
        requests = protocol.parse_batch(frames)
    except Exception:  # the controller times the batch out and answers it
        log.exception("worker dropped a batch it cannot read")
        return None
    message = f"The worker failed this batch: {type(exc).__name__}: {exc}"
    return protocol.done(
        protocol.Result(r.rid, *CODECS[r.codec].error(500, "InternalServerException", message))
        for r in requests)


class Batches:
    """Runs the batches a serving worker gets, from the controller or on a lease, and sends
    their answers where they go."""

    def __init__(self, sock, handler, context, links: FrontendLinks, max_response_size: int,
                 threads: Threads) -> None:
        self.sock = sock
        self.handler = handler
        self.context = context
        self.links = links
        self.max_response_size = max_response_size
        self.threads = threads
        self.chunks = ChunkRoute(sock, links)
        attach_stream(context, self.chunks, max_response_size)
        self.tally: list[protocol.Served] = []  # leased batches not yet reported
        self.tally_since = 0.0
        # leased batches run since the controller last recalled this worker or sent it a
        # batch: a lease ended by a revoke (a new default, a rotated key) left it in use
        self.leased_since_ours = 0

    def report(self) -> None:
        """Tell the controller of the leased batches answered since the last report."""
        if self.tally:
            tally, self.tally = self.tally, []
            self.sock.send_multipart(protocol.served(tally))

    def report_by(self) -> float | None:
        """When the tally must go, at the latest (None: nothing to report)."""
        return self.tally_since + SERVED_EVERY if self.tally else None

    def from_controller(self, frames: list[bytes]) -> None:
        """A BATCH the controller sent: answered straight to the frontends that asked when
        they all can take it now, the controller told first (ANSWERED: it then knows this
        worker is free before any client has its answer), else through the controller (DONE)."""
        self.leased_since_ours = 0
        try:
            requests = protocol.parse_batch(frames[1:])
            results = self._run(requests, None)
            direct = self.links.reachable(requests, results, self.chunks.streamed)
        except protocol.ProtocolError as exc:
            log.error("worker dropped a malformed batch: %s", exc)
            return
        except Exception as exc:  # a bug of ours: the batch fails, the worker lives on
            log.exception("batch failed outside the handler")
            failed = _failed_batch(frames[1:], exc)
            if failed is not None:
                self.sock.send_multipart(failed)
            return
        if direct is None:
            self.sock.send_multipart(protocol.done(results))
            return
        self.sock.send_multipart(protocol.answered(results))
        self.links.send_reachable(direct)

    def leased(self, frames: list[bytes], conn: socket.socket | None = None) -> None:
        """A BATCH a frontend sent on its lease (on ``conn``): answered to it directly, on
        ``conn`` when the answer fits in a job message and nothing of it was streamed, else on
        its reply socket; then counted by the controller (SERVED), which forwards the answers
        only if they could not go."""
        began = time.monotonic()
        if not frames or frames[0] != protocol.BATCH:
            log.error("worker dropped a leased message of kind %r", frames[0][:8] if frames
                      else b"")
            return
        try:
            requests = protocol.parse_batch(frames[1:])
        except protocol.ProtocolError as exc:
            log.error("worker dropped a malformed leased batch: %s", exc)
            return
        fid = requests[0].fid if requests else b""
        if not requests or any(r.fid != fid for r in requests):
            log.error("worker dropped a leased batch not from one frontend")
            return
        try:
            results = self._run(requests, fid)
        except Exception as exc:  # a bug of ours: the batch fails, the worker lives on
            log.exception("leased batch failed outside the handler")
            failed = _failed_batch(frames[1:], exc)
            if failed is None:
                return
            results = protocol.parse_results(failed[1:])
        delivered = False
        if conn is not None and not self.chunks.streamed:
            reply = protocol.job_message(protocol.replies(results))
            if reply is not None:
                try:
                    conn.send(reply)
                    delivered = True
                except OSError:  # its buffer is full, or the frontend went: the ZeroMQ way
                    pass
        if not delivered:
            delivered = self.links.deliver(requests, results, wait=LINK_WAIT)
        self.leased_since_ours += 1
        if not self.tally:
            self.tally_since = began
        kept = results if not delivered else [protocol.Result(r.rid, r.head, b"") for r in results]
        self.tally.append(protocol.Served(fid, delivered, time.monotonic() - began, kept))
        if not delivered:  # the controller forwards these: at once
            self.report()

    def _run(self, requests: list[protocol.Request], leased_to: bytes | None
             ) -> list[protocol.Result]:
        self.chunks.streamed.clear()
        self.chunks.leased_to = leased_to
        try:
            with self.threads.batch():
                return answer_batch(self.handler, self.context, requests,
                                    self.max_response_size)
        finally:
            tag_output("")
            self.chunks.leased_to = None
