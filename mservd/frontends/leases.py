"""A frontend's side of a lease (``mservd/core/leases.py``): the idle workers the controller lent
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

The link to a worker's job socket is a plain Unix ``SOCK_SEQPACKET`` connection (a message is
sent whole or not at all, and a ping-pong over one takes a third of ZeroMQ's time), read by the
event loop: the worker answers a leased batch on it, or on the reply socket when the answer is
too big for one message or was streamed. A link outlives its lease and closes when the worker
is gone (a link made anew with each ZeroMQ lease was often not yet connected when a lone
client's next request came, which then went to the controller and recalled the worker).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mservd import protocol
from mservd.errors import WorkerDied

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Held:
    lease: protocol.Lease
    sock: socket.socket | None  # the link to the worker's job socket (None: no connection)
    running: set[bytes] = field(default_factory=set)  # the batch sent on it, not yet answered


class HeldLeases:
    def __init__(self, fid: bytes, loop: asyncio.AbstractEventLoop,
                 deliver: Callable[[list[bytes]], None]) -> None:
        self.fid = fid  # this frontend's reply socket: where the worker answers
        self.loop = loop
        self.deliver = deliver  # an answer a worker sent on its link (a REPLY's frames)
        self.by_route: dict[tuple[str, str | None], Held] = {}
        self.links: dict[str, socket.socket] = {}  # a job socket -> our link to it
        self.buffer = bytearray(protocol.JOB_MESSAGE_MAX)
        # rid -> (the worker's jobs socket, the PREDICT message, when it has hung)
        self.sent: dict[bytes, tuple[str, list[bytes], float]] = {}
        self.streamed: set[bytes] = set()  # of those, the ones that sent their client a part

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

    def _link(self, jobs: str) -> socket.socket | None:
        link = self.links.get(jobs)
        if link is not None:
            return link
        link = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        link.setblocking(False)
        try:  # a Unix socket connects at once, or not at all
            link.connect(jobs[len("ipc://"):])
        except OSError as exc:
            log.warning("could not connect to the lent worker at %s: %s", jobs, exc)
            link.close()
            return None
        self.links[jobs] = link
        self.loop.add_reader(link.fileno(), self._read, jobs, link)
        return link

    def _read(self, jobs: str, link: socket.socket) -> None:
        """Answers the worker sent on ``link``."""
        def dropped(exc: protocol.ProtocolError) -> None:
            log.error("dropped a malformed answer from the worker at %s: %s", jobs, exc)

        for frames in protocol.read_job_messages(link, self.buffer, dropped):
            if frames is None:  # the worker went (its REVOKE, lost, follows)
                self._close(jobs)
                return
            self.deliver(frames)

    def _close(self, jobs: str) -> None:
        link = self.links.pop(jobs, None)
        if link is not None:
            self.loop.remove_reader(link.fileno())
            link.close()

    def end(self, jobs: str, lost: bool = False) -> list[list[bytes]]:
        """A REVOKE: the lease on ``jobs`` ends. ``lost``: the worker is gone, and so is our
        link to it; the PREDICT messages of the requests sent there and not answered are
        returned, to be sent to the controller instead, but for those that had streamed a
        part to their client: run again they would send it twice, so they are answered
        "Worker died" here, as the controller answers its own."""
        for key, held in list(self.by_route.items()):
            if held.lease.jobs == jobs:
                del self.by_route[key]
        if not lost:
            return []
        self._close(jobs)
        again = []
        for rid in [rid for rid, (where, _, _) in self.sent.items() if where == jobs]:
            if rid in self.streamed:
                died = protocol.Reply.error(WorkerDied.after_parts()).result(rid)
                self.deliver([protocol.REPLY, rid, died.head, died.body])
            else:
                again.append(self.sent.pop(rid)[1])
        return again

    def part_sent(self, rid: bytes) -> None:
        """A part of ``rid``'s answer reached its client."""
        if rid in self.sent:
            self.streamed.add(rid)

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
            # a /wfpredict names a workflow, which the controller runs: never a lent worker of
            # a model of the same name
            if (held is None or held.running or route.explain or route.workflow
                    or not self._allowed(held, route)):
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
            message.append(protocol.packb([rid, protocol.PREDICTION, self.fid]))
            message.extend(frames[2:])  # the meta header and payloads, as they are
        data = protocol.job_message(message)
        if data is None or held.sock is None:  # too big for one: the controller's way
            return False
        try:
            held.sock.send(data)
        except OSError:  # the worker's buffer is full, or it went
            return False
        hung_at = time.monotonic() + held.lease.timeout
        for rid, frames in taken:
            held.running.add(rid)
            self.sent[rid] = (held.lease.jobs, frames, hung_at)
        return True

    def answered(self, rid: bytes) -> None:
        """The final answer of ``rid`` came: a lease it ran on may take the next batch."""
        self.streamed.discard(rid)
        if self.sent.pop(rid, None) is None:
            return
        for held in self.by_route.values():
            held.running.discard(rid)

    def close(self) -> None:
        for jobs in list(self.links):
            self._close(jobs)
        self.by_route.clear()
