"""A worker's own lines to the frontends: the answers of a finished batch go straight to the
frontends that asked, and the controller only hears that they went (ANSWERED).

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

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import zmq

from mservd import protocol

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
        seconds for a connection); True when every answer
        went, so that the controller is told with ANSWERED. False: some could not (a frontend
        not connected yet or gone, a streamed answer whose parts went through the controller
        and must arrive first): the caller sends the whole DONE to the controller, and a
        frontend drops the copy of an answer it already has."""
        if self.prefix is None or streamed and not set(streamed).isdisjoint(
                r.rid for r in results):
            return False
        fids = {request.rid: request.fid for request in requests}
        grouped: dict[bytes, list[protocol.Result]] = {}
        for result in results:
            fid = fids.get(result.rid, b"")
            if not fid.startswith(self.prefix):
                return False
            grouped.setdefault(fid, []).append(result)
        every = True
        for fid, answers in grouped.items():
            every = self.send(fid, protocol.replies(answers), wait) and every
        return every

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
                if not wait or not sock.poll(wait * 1000.0, zmq.POLLOUT):
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
