"""A worker's own lines to the frontends: the answers of a finished batch go straight to the
frontends that asked, and the controller only hears that they go (ANSWERED, sent first).

An answer that the controller forwards costs it a wake-up, a parse and a send, and costs the
request that much latency; sent directly it passes one process fewer (``protocol.py`` has the
layout). A frontend's address is the name the controller knows it by (its reply endpoint, in
the daemon's run folder); the worker connects to it the first time a job names it. ZeroMQ
connects in the background and, with ``IMMEDIATE``, refuses a send until it has: that batch
(and any batch for a frontend that has gone) goes back through the controller as before.

A batch a frontend sent on a lease (``leases.py``) has no other way to its frontend that keeps
its streamed parts in order: its sends wait a moment for the connection (``wait``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import cast

import zmq

from mservd import protocol

log = logging.getLogger(__name__)

MAX_LINKS = 64  # frontends a worker keeps a socket to; the least recently used one goes first
SEND_HWM = 1000  # answers queued for one frontend before the controller's path takes over


class FrontendLinks:
    def __init__(self, zctx: zmq.Context, backend_endpoint: str) -> None:
        self.zctx = zctx
        self.prefix = protocol.reply_prefix(backend_endpoint)
        self.links: OrderedDict[bytes, zmq.Socket] = OrderedDict()

    def deliver(self, requests: Sequence[protocol.Request], results: list[protocol.Result],
                streamed: Iterable[bytes] = (), wait: float = 0.0) -> bool:
        """Send each frontend its answers of this batch as one REPLY (waiting up to ``wait``
        seconds for a connection); True when every answer went. False: some could not (see
        :meth:`grouped`), and the caller sends them through the controller; a frontend drops
        the copy of an answer it already has."""
        grouped = self.grouped(requests, results, streamed)
        if grouped is None:
            return False
        every = True
        for fid, answers in grouped.items():
            every = self.send(fid, protocol.replies(answers), wait) and every
        return every

    def reachable(self, requests: Sequence[protocol.Request], results: list[protocol.Result],
                  streamed: Iterable[bytes] = ()) -> dict[bytes, list[protocol.Result]] | None:
        """This batch's answers by frontend when every frontend that asked can take a message
        this moment, so that the controller can be told ANSWERED *before* they go (a client
        answered first could otherwise send its next request ahead of it, and find this worker
        busy); None when one cannot."""
        grouped = self.grouped(requests, results, streamed)
        if grouped is None:
            return None
        if not all(self.can_take(fid) for fid in grouped):
            return None  # not connected (yet), or its queue is full
        return grouped

    def warm(self, fid: bytes) -> None:
        """Start connecting to frontend ``fid`` (in the background), if a worker may."""
        if self.prefix is not None and fid.startswith(self.prefix):
            try:
                self._link(fid)
            except (zmq.ZMQError, UnicodeDecodeError):
                pass

    def can_take(self, fid: bytes) -> bool:
        """Whether frontend ``fid`` can take a message from this worker this moment."""
        if self.prefix is None or not fid.startswith(self.prefix):
            return False
        try:
            return bool(cast(int, self._link(fid).getsockopt(zmq.EVENTS)) & zmq.POLLOUT)
        except (zmq.ZMQError, UnicodeDecodeError):
            return False

    def send_reachable(self, grouped: dict[bytes, list[protocol.Result]]) -> None:
        """Send what :meth:`reachable` found could go. The controller has been told they went:
        answers for a frontend that vanished in between are dropped (its clients went with
        it), with a warning."""
        for fid, answers in grouped.items():
            if not self.send(fid, protocol.replies(answers)):
                log.warning("dropped %d answers: frontend %r went before they could be sent",
                            len(answers), fid)

    def grouped(self, requests: Sequence[protocol.Request], results: list[protocol.Result],
                streamed: Iterable[bytes] = ()) -> dict[bytes, list[protocol.Result]] | None:
        """This batch's answers by the frontend that asked; None when one must pass the
        controller: a frontend outside this daemon's run folder or known by a name only, or
        a streamed answer whose parts went through the controller and must arrive first."""
        if self.prefix is None or streamed and not set(streamed).isdisjoint(
                r.rid for r in results):
            return None
        fids = {request.rid: request.fid for request in requests}
        grouped: dict[bytes, list[protocol.Result]] = {}
        for result in results:
            fid = fids.get(result.rid, b"")
            if not fid.startswith(self.prefix):
                return None
            grouped.setdefault(fid, []).append(result)
        return grouped

    def send(self, fid: bytes, frames: list[bytes], wait: float = 0.0) -> bool:
        """Send frontend ``fid`` one message, waiting up to ``wait`` seconds for the
        connection; False if it could not go."""
        if self.prefix is None or not fid.startswith(self.prefix):
            return False
        try:
            sock = self._link(fid)
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:  # not connected (yet): ZeroMQ connects in the background
                if not wait or not sock.poll(int(wait * 1000.0), zmq.POLLOUT):
                    return False
                sock.send_multipart(frames, zmq.NOBLOCK)
        except (zmq.ZMQError, UnicodeDecodeError):  # Again, still: gone, or never there
            return False
        return True

    def _link(self, fid: bytes) -> zmq.Socket:
        sock = self.links.get(fid)
        if sock is not None:
            self.links.move_to_end(fid)
            return sock
        if len(self.links) >= MAX_LINKS:
            _, oldest = self.links.popitem(last=False)
            oldest.close(linger=0)
        sock = self.zctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # no queue for a frontend not (yet) connected
        sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        try:
            sock.connect(fid.decode("ascii"))
        except BaseException:
            sock.close(linger=0)
            raise
        self.links[fid] = sock
        return sock

    def close(self) -> None:
        for sock in self.links.values():
            sock.close(linger=0)
        self.links.clear()
