"""The asyncio frontends' line to the controller: one DEALER socket, one reader task.

Used by both frontend processes (the HTTP server and the gRPC frontend): every request
coroutine sends on the one socket, which only the event loop's thread touches, and awaits a
future that the reader task resolves by request id. A streamed answer's parts arrive on a queue
instead. The requests of one turn of the event loop leave as one PREDICT message at its end, and
the controller's REPLY may answer several at once: a message costs a wake-up of each process it
passes, however many requests it carries. The frontend keeps no other state but the leases the
controller gave it (below), which the controller can take back at any time.

Beside it the bridge binds a PULL socket, its *reply socket*, in the daemon's run folder, and
names itself to the controller by that address: workers send their answers there directly
(``mservd/worker/frontend_links.py``), one process fewer on the way back. Both sockets are read alike.
While the controller has lent this frontend an idle worker (``leases.py``), the predictions of
a turn for its version go to that worker instead, one process fewer on the way there too.

The questions anyone may ask the controller (health, metrics, an unknown token, metadata) go
through :meth:`AsyncBridge.ask_open`: one at a time for the whole process, spaced, each kind
in its own lane so that health checks never wait behind strangers' tokens (``spaced.py``). A
call's token is asked about before its body is read (:meth:`AsyncBridge.refusal`), at most
``unknown_token_limit`` at once per client address, and remembered while its holder keeps
calling.

The controller is the daemon itself. Should it die (SIGKILL, a crash), its end of the socket
closes, which a monitor of ours hears at once: every call still waiting is answered 503 (a
stream ends with that error as its final part: an SSE error event, a gRPC UNAVAILABLE), every
later call too, and ``on_lost`` is called (by default the process stops as on SIGTERM: a
frontend without its controller has nothing to serve).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from mservd import protocol
from mservd.errors import NoWorker, WorkerDied
from mservd.frontends.bridge import AcceptedTokens, ClientGone, ControllerGone, client_network
from mservd.frontends.leases import HeldLeases
from mservd.frontends.spaced import SpacedQuestions
from mservd.protocol import Reply

log = logging.getLogger(__name__)
WATCH_INTERVAL = 1.0  # seconds between checks for leased batches that hung
TOKEN_QUESTION_TIMEOUT = 10.0  # seconds for the controller's answer about a token
UNKNOWN_TOKEN_LIMIT = 8  # unknown tokens of one client address waiting for a check at once
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
LANES = {"ping": "health", "metrics": "metrics", "authorize": "tokens"}  # by op; others: ""
CONTROLLER_LOST = ("The controller (the mservd daemon) is gone: this frontend is stopping. "
                   "Start mservd again.")


def stop_this_process() -> None:
    """What a frontend does once its controller is gone: stop as on SIGTERM (its server
    drains what is left, which the bridge has answered already)."""
    os.kill(os.getpid(), signal.SIGTERM)


def _time_out(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class AsyncBridge:
    """A plain (non-asyncio) ZeroMQ socket driven by the event loop: sends never block (no
    high-water mark), and the socket's file descriptor wakes :meth:`_drain`. ZeroMQ signals
    that descriptor by edge, and any send may consume the edge, so every send and every drain
    ends by asking the socket itself whether answers are waiting."""

    def __init__(self, endpoint: str, unknown_token_limit: int = UNKNOWN_TOKEN_LIMIT,
                 on_lost: Callable[[], None] = stop_this_process) -> None:
        self.endpoint = endpoint
        self.on_lost = on_lost  # called once, when the controller's end of the socket closes
        self.lost = False  # the controller is gone: every call is answered 503 at once
        self._monitor: Any = None  # the socket's events: a disconnection means the above
        self._monitor_check: asyncio.TimerHandle | None = None  # its next look, by timer
        self._ctx: zmq.Context | None = None
        self._sock: Any = None
        self._replies: Any = None  # the reply socket workers answer on, once bound
        self._replies_path = ""  # ... and its file, removed on close (ZeroMQ leaves it)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[bytes, asyncio.Future | asyncio.Queue] = {}
        self._drain_scheduled = False
        self._outbox: list[list[bytes]] = []  # this turn's PREDICT messages, sent as one
        self._leases: HeldLeases | None = None  # workers lent to us, once the reply socket is
        self._watch: asyncio.TimerHandle | None = None  # the next check for hung leased batches
        self._open_questions = SpacedQuestions(self._ask_open_now, "questions anyone may ask",
                                               per_client={"tokens": unknown_token_limit,
                                                           "metrics": unknown_token_limit})
        # tokens the controller accepted lately, per API: one memory for the whole process
        self._accepted = {protocol.API_INFERENCE: AcceptedTokens(),
                          protocol.API_MANAGEMENT: AcceptedTokens()}

    def _socket(self) -> Any:
        if self._sock is None:
            self._ctx = zmq.Context()
            self._loop = asyncio.get_running_loop()
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            address = self._bind_replies()
            if address is not None:  # the controller knows this frontend by it
                sock.setsockopt(zmq.ROUTING_ID, address.encode())
            self._monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self._loop.add_reader(self._monitor.fileno(), self._on_socket_event)
            sock.connect(self.endpoint)
            self._sock = sock
            self._loop.add_reader(sock.fileno(), self._drain)
            self._on_socket_event()  # takes the first edge: else the next may never signal
        return self._sock

    def _on_socket_event(self) -> None:
        """The monitor's events (edge-signalled, so read until none is left): a
        disconnection is the controller's end closing, which only its death does while we
        run (a daemon that stops stops its frontends first)."""
        monitor = self._monitor
        while monitor is not None and monitor.getsockopt(EVENTS) & POLLIN:
            event = recv_monitor_message(monitor, NOBLOCK)
            if event["event"] == zmq.EVENT_DISCONNECTED and not self.lost:
                self._controller_lost()
        if monitor is not None and not self.lost and self._loop is not None:
            # a second look each WATCH_INTERVAL, should an edge ever be missed
            if self._monitor_check is not None:
                self._monitor_check.cancel()
            self._monitor_check = self._loop.call_later(WATCH_INTERVAL, self._on_socket_event)

    def _controller_lost(self) -> None:
        """Answer every waiting call 503 now (a stream's final part: its error), refuse every
        later one, and tell ``on_lost``."""
        self.lost = True
        waiting = list(self._waiting)
        log.error("the controller at %s is gone: %d calls waiting answered 503, and this "
                  "frontend stops", self.endpoint, len(waiting))
        if self._leases is not None:
            self._leases.close()  # lent workers die with their daemon
            self._leases = None
        gone = Reply.error(NoWorker(CONTROLLER_LOST))
        for rid in waiting:
            answer = gone.result(rid)
            self._deliver_one(protocol.REPLY, rid, [answer.head, answer.body])
        try:
            self.on_lost()
        except Exception:  # stopping is a courtesy: the answers above are what matter
            log.exception("could not stop this frontend after losing the controller")

    def _bind_replies(self) -> str | None:
        """Bind the reply socket; its address, or None where there is none (the controller
        is not on ``ipc://``, or the path is too long): answers then all come back through the
        controller."""
        address = protocol.reply_endpoint(self.endpoint, os.getpid(), secrets.token_hex(4))
        if address is None:
            return None
        assert self._ctx is not None and self._loop is not None
        replies = self._ctx.socket(zmq.PULL)
        replies.setsockopt(zmq.LINGER, 0)
        replies.setsockopt(zmq.RCVHWM, 0)
        try:
            replies.bind(address)
        except zmq.ZMQError as exc:
            log.warning("no reply socket at %s (%s): answers come through the controller",
                        address, exc)
            replies.close(linger=0)
            return None
        self._replies = replies
        self._replies_path = address[len("ipc://"):]
        self._leases = HeldLeases(address.encode(), self._loop, self._deliver)
        self._loop.add_reader(replies.fileno(), self._drain)
        return address

    def _send(self, frames: list[bytes]) -> None:
        """Predictions wait for the end of this turn of the loop (:meth:`_flush`); anything
        else leaves at once, after them, so a CANCEL never overtakes its request."""
        sock = self._socket()
        if frames[0] == protocol.PREDICT:
            if not self._outbox:
                assert self._loop is not None
                self._loop.call_soon(self._flush)
            self._outbox.append(frames)
            return
        self._flush()
        sock.send_multipart(frames, zmq.NOBLOCK)
        self._check_pending()

    def _flush(self) -> None:
        if not self._outbox or self._sock is None:
            return
        outbox, self._outbox = self._outbox, []
        if self._leases:  # those for a lent worker go to it
            if self._sock.getsockopt(EVENTS) & POLLIN:
                self._drain()  # a REVOKE that came before them counts
            outbox = self._leases.send(outbox)
            if self._leases.sent and self._watch is None:
                self._watch_leased()
            if not outbox:
                self._check_pending()
                return
        message = outbox[0] if len(outbox) == 1 else protocol.predictions(outbox)
        self._sock.send_multipart(message, zmq.NOBLOCK, copy=False)  # big payloads uncopied
        self._check_pending()

    def _watch_leased(self) -> None:
        """Every second while leased batches are out: those past their lease's timeout are
        answered "Worker died." and the controller is asked to kill their worker."""
        self._watch = None
        if self._leases is None or not self._leases.sent or self._loop is None:
            return
        for jobs, rids in self._leases.overdue(time.monotonic()).items():
            log.error("requests %s sent to worker %s on a lease had no answer in time",
                      b",".join(rids).decode(errors="replace"), jobs)
            for rid in rids:
                died = Reply.error(WorkerDied()).result(rid)
                self._deliver_one(protocol.REPLY, rid, [died.head, died.body])
            self._send(protocol.overdue(jobs))
        if self._leases is not None and self._leases.sent and self._watch is None:
            self._watch = self._loop.call_later(WATCH_INTERVAL, self._watch_leased)

    def _check_pending(self) -> None:
        if self._drain_scheduled or self._sock is None:
            return
        if (self._sock.getsockopt(EVENTS) & POLLIN
                or self._replies is not None and self._replies.getsockopt(EVENTS) & POLLIN):
            self._drain_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Answers from the controller and from workers, bounded per turn so that
        connections are served between."""
        self._drain_scheduled = False
        if self._sock is None:
            return
        for sock in (self._sock, self._replies):
            if sock is None:
                continue
            for _ in range(1000):  # asking the socket is cheaper than a zmq.Again raised
                if not sock.getsockopt(EVENTS) & POLLIN:
                    break
                self._deliver(sock.recv_multipart(NOBLOCK))
        self._check_pending()

    def _deliver(self, frames: list[bytes]) -> None:
        kind = frames[0] if frames else b""
        if kind in (protocol.REPLY, protocol.CHUNK):
            for i in range(1, len(frames) - 2, 3):  # one answer or part, or several
                self._deliver_one(kind, frames[i], frames[i + 1 : i + 3])
        elif kind in (protocol.LEASE, protocol.REVOKE) and self._leases is not None:
            self._on_lease(kind, frames)

    def _on_lease(self, kind: bytes, frames: list[bytes]) -> None:
        """The controller lends a worker, or takes it back (and then, if it is gone, the
        requests sent it go through the controller)."""
        assert self._leases is not None
        try:
            if kind == protocol.LEASE and len(frames) == 2:
                self._leases.grant(protocol.parse_lease(frames[1]))
            elif kind == protocol.REVOKE and len(frames) == 3:
                for again in self._leases.end(frames[1].decode(), lost=frames[2] == b"1"):
                    self._send(again)
        except (protocol.ProtocolError, UnicodeDecodeError, zmq.ZMQError) as exc:
            log.error("dropped a %r message from the controller: %s", kind, exc)

    def _deliver_one(self, kind: bytes, rid: bytes, answer: list[bytes]) -> None:
        """Hand ``[kind, rid, head, body]`` to the coroutine awaiting ``rid``."""
        if self._leases is not None:
            if kind == protocol.REPLY:
                self._leases.answered(rid)
            else:
                self._leases.part_sent(rid)
        waiter = self._waiting.get(rid)
        if waiter is None:
            return  # the client gave up; the answer has nowhere to go
        frames = [kind, rid, *answer]
        if kind == protocol.REPLY:
            del self._waiting[rid]
        if isinstance(waiter, asyncio.Queue):
            waiter.put_nowait(frames)
        elif kind == protocol.REPLY:
            if not waiter.done():
                waiter.set_result(frames)
        else:  # the first part of a streamed answer: the rest follow on a queue
            parts: asyncio.Queue = asyncio.Queue()
            parts.put_nowait(frames)
            self._waiting[rid] = parts
            if not waiter.done():
                waiter.set_result(parts)

    async def call(self, rid: bytes, frames: list[bytes], timeout: float,
                   stream: bool = False) -> Reply:
        """Send a request and await its answer.

        With ``stream`` a streamed answer comes back as its first part, with ``stream`` set to
        an async iterator over the later parts' bodies (final one last); without, only the
        final answer is returned.
        """
        if self.lost:
            raise ControllerGone(CONTROLLER_LOST)
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiting[rid] = waiter
        streaming = False
        # a timer on the future rather than wait_for, which wraps it in one more task
        timer = loop.call_later(timeout, _time_out, waiter)
        try:
            try:
                self._send(frames)
                got = await waiter
            finally:
                timer.cancel()
            if isinstance(got, asyncio.Queue):
                first = await self._next_part(got, timeout)
                if stream:
                    streaming = True
                    reply = Reply.from_result(protocol.parse_result(first[1:]))
                    reply.stream = self._parts(rid, got, first, timeout, reply)
                    reply.give_up = lambda: self._give_up(rid)
                    return reply
                while first[0] != protocol.REPLY:
                    first = await self._next_part(got, timeout)
                got = first
        except TimeoutError:  # no one waits for it now: its worker stops working on it
            self._give_up(rid)
            raise ControllerGone(f"No answer from the controller within {timeout:.0f} s.") \
                from None
        except asyncio.CancelledError:  # the caller gave up (a gRPC client cancelled)
            self._give_up(rid)
            raise
        finally:
            if not streaming:
                self._waiting.pop(rid, None)
        return Reply.from_result(protocol.parse_result(got[1:]))

    @staticmethod
    async def _next_part(parts: asyncio.Queue, timeout: float) -> list[bytes]:
        got = await asyncio.wait_for(parts.get(), timeout)
        if got is None:
            raise ClientGone()
        return got

    async def _parts(self, rid: bytes, parts: asyncio.Queue, first: list[bytes],
                     timeout: float, reply: Reply) -> AsyncIterator[bytes]:
        """The bodies of a streamed answer after the first; ends with the final answer's,
        whose status it sets on ``reply`` first. Left unread (the caller gave up), the
        request is cancelled: a continuous worker frees its slot."""
        ended = first[0] == protocol.REPLY
        try:
            if ended:
                reply.final_status = reply.status
                return
            while True:
                try:
                    got = await asyncio.wait_for(parts.get(), timeout)
                except TimeoutError:
                    ended = True
                    return  # the worker went quiet: the stream just ends
                if got is None:
                    ended = True
                    return  # cancelled: the client went away
                if got[0] == protocol.REPLY:
                    ended = True
                    reply.final_status = protocol.Head.parse(got[2]).status
                yield got[3]
                if ended:
                    return
        finally:
            if ended:
                self._waiting.pop(rid, None)
            else:
                self._give_up(rid)

    def _give_up(self, rid: bytes) -> None:
        """Its caller stopped waiting for ``rid`` (cancelled, or a stream left unread): the
        controller drops the request, or frees its slot on a continuous worker."""
        if self._waiting.pop(rid, None) is not None and self._sock is not None:
            self._send(protocol.cancel(rid))

    def cancel(self, rid: bytes) -> None:
        """The client went away: the controller drops the request if it is still queued, and
        the coroutine awaiting it gets :class:`ClientGone` (a stream just ends)."""
        waiter = self._waiting.pop(rid, None)
        if isinstance(waiter, asyncio.Queue):
            waiter.put_nowait(None)
        elif waiter is not None and not waiter.done():
            waiter.set_exception(ClientGone())
        if self._sock is not None:
            self._send(protocol.cancel(rid))

    async def manage(self, op: str, args: dict[str, Any], token: str | None, timeout: float,
                     api: str = protocol.API_MANAGEMENT) -> Reply:
        rid = uuid.uuid4().hex.encode()
        return await self.call(rid, protocol.manage(protocol.ManageCall(rid, op, args, token, api)),
                               timeout)

    async def ask_open(self, op: str, args: dict[str, Any], token: str | None,
                       timeout: float, api: str = protocol.API_MANAGEMENT,
                       client: str | None = None) -> Reply:
        """A MANAGE question anyone may ask (health, metrics, an unknown token, metadata):
        asked one at a time for this process and spaced, so a stranger's flood of them holds
        the controller a tenth of its time at most. Each kind waits in its own lane (pings,
        metrics, tokens, the rest: ``LANES``), the lanes taking turns; raises
        ``spaced.TooManyQuestions`` past 64 different ones waiting in a lane, or past a
        client's own bound (``client``: its address)."""
        if self.lost:
            raise ControllerGone(CONTROLLER_LOST)
        return await self._open_questions.answer(
            (op, json.dumps(args, sort_keys=True), token, timeout, api), LANES.get(op, ""),
            client_network(client))

    async def refusal(self, token: str | None, api: str,
                      timeout: float = TOKEN_QUESTION_TIMEOUT,
                      client: str | None = None) -> Reply | None:
        """The controller's refusal of ``token`` for ``api`` (401), or None: asked before a
        request's body or message is read, so a stranger's request costs no more than its
        head. A token accepted lately is taken without asking (``bridge.AcceptedTokens``); an
        unknown one is asked about as anyone's question is (:meth:`ask_open`, spaced, in the
        tokens' lane), at most ``unknown_token_limit`` at once for one ``client`` address
        (past it 503 at once, unasked). The controller still checks each call itself."""
        accepted = self._accepted[api]
        now = time.monotonic()
        if accepted.knows(token, now):
            return None
        reply = await self.ask_open("authorize", {}, token, timeout, api=api, client=client)
        if reply.status != 200:
            return reply
        accepted.accepted(token, now)
        return None

    def answered(self, token: str | None, api: str, status: int) -> None:
        """The controller answered a call that carried ``token`` (anything but 401: it took
        the token): the client's next calls skip :meth:`refusal`'s question while it keeps
        calling, whatever flood of strangers' questions waits."""
        self._accepted[api].answered(token, status)

    def forget(self, token: str | None, api: str) -> None:
        """``token`` was revoked: its next call is asked about again (``AcceptedTokens``)."""
        self._accepted[api].forget(token)

    async def _ask_open_now(self, question: tuple[str, str, str | None, float, str]) -> Reply:
        op, args, token, timeout, api = question
        return await self.manage(op, json.loads(args), token, timeout, api)

    def close(self) -> None:
        for timer in (self._monitor_check, self._watch):
            if timer is not None:
                timer.cancel()
        self._monitor_check = self._watch = None
        if self._monitor is not None and self._sock is not None:
            self._sock.disable_monitor()
        self._unwatch(self._monitor)
        self._monitor = None
        if self._leases is not None:
            self._leases.close()
            self._leases = None
        if self._replies is not None:
            self._unwatch(self._replies)
            self._replies = None
            with contextlib.suppress(OSError):
                os.unlink(self._replies_path)
        self._unwatch(self._sock)
        self._sock = None
        if self._ctx is not None:
            self._ctx.term()

    def _unwatch(self, sock: Any) -> None:
        """Stop reading ``sock`` and close it (None: nothing to do)."""
        if sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(sock.fileno())
            sock.close(linger=0)
