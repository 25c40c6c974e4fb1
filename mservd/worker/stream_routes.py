"""Which way a continuous worker's answers go: a sequence's streamed parts and its end straight
to the frontend that holds its client, the controller told only what it must.

A token forwarded by the controller costs it a wake-up, a parse and a send, and costs the
stream one process more on its way (issue 47: at 32 streams every token passed the controller).
So each sequence picks its way once, at its first part (or its answer, if it streams none):
straight to its frontend when that frontend can take a message now (``FrontendLinks``), else
through the controller as before. It keeps that way to its end, so its parts and its answer
never overtake each other on two roads.

What the controller still hears of a sequence that goes straight:
- its first part, *before* it goes (STEPPED with its time): a request that has sent its client
  parts is never run again when its worker dies, and time to first token is measured;
- the gaps between its parts, with the next STEPPED (at most every ``STEP_REPORT_INTERVAL``,
  and before its end);
- its end, as ANSWERED, before the answer goes (as a classic worker does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from mservd import protocol
from mservd.worker.frontend_links import FrontendLinks

log = logging.getLogger("mservd.worker")

Answer = tuple[protocol.Request, protocol.Result]  # a request and its part or answer


class StreamRoutes:
    """The way of each running sequence, and the timings the controller has not heard yet."""

    def __init__(self, links: FrontendLinks | None) -> None:
        self.links = links
        self.direct: dict[bytes, bytes] = {}  # rid -> its frontend, for sequences sent straight
        self.routed: set[bytes] = set()  # sequences that go through the controller
        self.last_part: dict[bytes, float] = {}  # when a direct sequence's last part went
        self.gaps: list[float] = []  # between direct parts, not yet told

    def joined(self, request: protocol.Request) -> None:
        """A sequence joins: its frontend's line starts connecting now (ZeroMQ connects in the
        background), so that it is up by the sequence's first token, a prefill later."""
        if self.links is not None:
            self.links.warm(request.fid)

    def left(self, rid: bytes) -> None:
        self.direct.pop(rid, None)
        self.routed.discard(rid)
        self.last_part.pop(rid, None)

    def way(self, request: protocol.Request) -> bytes | None:
        """The frontend a sequence's parts and answer go to straight; None: the controller."""
        rid = request.rid
        if rid in self.direct:
            return self.direct[rid]
        if rid not in self.routed:
            if self.links is not None and self.links.can_take(request.fid):
                self.direct[rid] = request.fid
                return request.fid
            self.routed.add(rid)
        return None

    def send(self, sock: Any, parts: Sequence[Answer], finished: Sequence[Answer]
             ) -> tuple[bool, list[protocol.Request]]:
        """Send one step's parts, then its answers, each its sequence's way. Returns whether
        the controller heard anything, and the direct sequences whose parts their frontend
        could not take (gone, or not reading): the caller ends them."""
        now = time.monotonic()
        firsts: list[tuple[bytes, float]] = []
        straight: dict[bytes, list[Answer]] = {}
        routed_parts = []
        for request, part in parts:
            fid = self.way(request)
            if fid is None:
                routed_parts.append(part)
                continue
            last = self.last_part.get(request.rid)
            if last is None:
                firsts.append((request.rid, now))
            else:
                self.gaps.append(now - last)
            self.last_part[request.rid] = now
            straight.setdefault(fid, []).append((request, part))
        told = False
        if firsts:  # before they go: the controller must know these streams have begun
            sock.send_multipart(protocol.stepped(firsts, self.take_gaps()))
            told = True
        if routed_parts:
            sock.send_multipart(protocol.chunks(routed_parts))
            told = True
        cut: list[protocol.Request] = []
        for fid, answers in straight.items():  # (straight only with links: see way())
            if not self.links or not self.links.send(fid, protocol.chunks(
                    part for _, part in answers)):
                cut += [request for request, _ in answers]
        return self.end(sock, finished, cut) or told, cut

    def end(self, sock: Any, finished: Sequence[Answer], cut: Sequence[protocol.Request] = ()
            ) -> bool:
        """Send the answers of the sequences that end, each its way (a direct one told to the
        controller first, as ANSWERED); whether the controller heard anything."""
        skip = {request.rid for request in cut}
        straight: dict[bytes, list[protocol.Result]] = {}
        routed = []
        for request, result in finished:
            if request.rid in skip:
                continue
            fid = self.way(request)
            self.left(request.rid)
            if fid is None:
                routed.append(result)
            else:
                straight.setdefault(fid, []).append(result)
        if straight:
            if self.gaps:  # told by a stream's end at the latest: the worker may go idle now
                sock.send_multipart(protocol.stepped(gaps=self.take_gaps()))
            sock.send_multipart(protocol.answered(r for rs in straight.values() for r in rs))
            for fid, results in straight.items():
                if not self.links or not self.links.send(fid, protocol.replies(results)):
                    log.warning("dropped %d answers: frontend %r went before they could be "
                                "sent", len(results), fid)
        if routed:
            sock.send_multipart(protocol.done(routed))
        return bool(straight or routed)

    def take_gaps(self) -> list[float]:
        gaps, self.gaps = self.gaps, []
        return gaps
