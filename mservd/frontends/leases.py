"""A frontend's side of a lease (``mservd/leases.py``): the idle workers the controller lent
it, and the batches it sent them itself.

The bridge hands every turn's predictions here first (:meth:`HeldLeases.send`); those for a
version whose lent worker has no batch of this frontend's running leave for the worker's job
socket as one BATCH, the others go to the controller as before. Under token authorization a
request goes to the worker only if its token is the inference key (its SHA-256 digest came
with the lease) and the key has not expired: any other goes to the controller, which answers
401 as it always did. The answer comes back on the reply socket like any direct answer
(:meth:`answered` frees the lease for the next batch). A lease ends when the controller says
so (REVOKE); if the worker is gone, the requests sent it without an answer are handed back to
go through the controller. A batch unanswered past the lease's timeout has hung:
:meth:`overdue` gives it up, for the bridge to answer and report.

The link to a worker's job socket outlives its lease and closes only when the worker is gone:
connecting takes a turn of ZeroMQ's I/O thread, and a request meeting a link not yet connected
goes to the controller, which recalls the worker; a link made anew with each lease could lose
that race again on every one (a lone client on a loaded machine got 27 of 40 requests leased
instead of 36). Closing a link at a revoke could also drop a batch it had not yet sent.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from mservd import protocol


@dataclass(eq=False)
class Held:
    lease: protocol.Lease
    sock: Any  # PUSH to the worker's job socket: its link
    running: set[bytes] = field(default_factory=set)  # the batch sent on it, not yet answered


class HeldLeases:
    def __init__(self, zctx: zmq.Context, fid: bytes) -> None:
        self.zctx = zctx
        self.fid = fid  # this frontend's reply socket: where the worker answers
        self.by_route: dict[tuple[str, str | None], Held] = {}
        self.links: dict[str, Any] = {}  # a job socket -> our PUSH to it, while its worker lives
        # rid -> (the worker's jobs socket, the PREDICT message, when it has hung)
        self.sent: dict[bytes, tuple[str, list[bytes], float]] = {}

    def __bool__(self) -> bool:
        return bool(self.by_route)

    def grant(self, lease: protocol.Lease) -> None:
        """A LEASE: connect to the worker; it takes this version's requests, and those naming
        no version while it is the default."""
        self.end(lease.jobs)
        keys = [(lease.model, lease.version)] + ([(lease.model, None)] if lease.default else [])
        for key in keys:  # one lease per route: an older one it replaces ends
            older = self.by_route.get(key)
            if older is not None:
                self.end(older.lease.jobs)
        held = Held(lease, self._link(lease.jobs))
        for key in keys:
            self.by_route[key] = held

    def _link(self, jobs: str) -> Any:
        sock = self.links.get(jobs)
        if sock is None:
            sock = self.links[jobs] = self.zctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            # not connected (yet, or any more): the controller's way
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.connect(jobs)
        return sock

    def end(self, jobs: str, lost: bool = False) -> list[list[bytes]]:
        """A REVOKE: the lease on ``jobs`` ends. ``lost``: the worker is gone, and so is our
        link to it; the PREDICT messages of the requests sent there and not answered are
        returned, to be sent to the controller instead."""
        for key, held in list(self.by_route.items()):
            if held.lease.jobs == jobs:
                del self.by_route[key]
        if not lost:
            return []
        sock = self.links.pop(jobs, None)
        if sock is not None:
            sock.close(linger=0)
        again = [rid for rid, (where, _, _) in self.sent.items() if where == jobs]
        return [self.sent.pop(rid)[1] for rid in again]

    def overdue(self, now: float) -> dict[str, list[bytes]]:
        """The requests whose worker has not answered in time, by worker (each such lease
        ends); they are no longer awaited here."""
        late: dict[str, list[bytes]] = {}
        for rid, (jobs, _, hung_at) in list(self.sent.items()):
            if now >= hung_at:
                del self.sent[rid]
                late.setdefault(jobs, []).append(rid)
        for jobs in late:
            self.end(jobs)
        return late

    def send(self, outbox: list[list[bytes]]) -> list[list[bytes]]:
        """Send what this turn's PREDICT messages can go to lent workers; the rest, returned,
        go to the controller."""
        batches: dict[int, tuple[Held, list[tuple[bytes, list[bytes]]]]] = {}
        rest = []
        for frames in outbox:
            route = protocol.parse_route(frames[1])
            held = self.by_route.get((route.model, route.version))
            if held is None or held.running or route.explain or not self._allowed(held, route):
                rest.append(frames)
                continue
            _, taken = batches.setdefault(id(held), (held, []))
            if len(taken) < held.lease.batch:
                taken.append((route.rid, frames))
            else:
                rest.append(frames)
        for held, taken in batches.values():
            if not self._send_batch(held, taken):
                rest.extend(frames for _, frames in taken)
        return rest

    @staticmethod
    def _allowed(held: Held, route: protocol.Route) -> bool:
        """Whether the request's token lets it go to the worker (always, without keys)."""
        lease = held.lease
        if lease.key_digest is None:
            return True
        if not route.token or lease.key_expires is None or time.time() > lease.key_expires:
            return False
        digest = hashlib.sha256(route.token.encode()).digest()
        return hmac.compare_digest(digest, lease.key_digest)

    def _send_batch(self, held: Held, taken: Sequence[tuple[bytes, list[bytes]]]) -> bool:
        message = [protocol.BATCH]
        for rid, frames in taken:
            message.append(protocol.packb([rid, False, self.fid]))
            message.extend(frames[2:])  # the meta header and payloads, as they are
        try:
            held.sock.send_multipart(message, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:  # Again: not connected yet, or the worker went
            return False
        hung_at = time.monotonic() + held.lease.timeout
        for rid, frames in taken:
            held.running.add(rid)
            self.sent[rid] = (held.lease.jobs, frames, hung_at)
        return True

    def answered(self, rid: bytes) -> None:
        """The final answer of ``rid`` came: a lease it ran on may take the next batch."""
        if self.sent.pop(rid, None) is None:
            return
        for held in self.by_route.values():
            held.running.discard(rid)

    def close(self) -> None:
        for sock in self.links.values():
            sock.close(linger=0)
        self.links.clear()
        self.by_route.clear()
