"""The frontend's line to the controller: one DEALER socket per frontend process.

Any number of greenlets (one per HTTP request) send on the shared socket; a single reader
greenlet receives replies and wakes the greenlet waiting on that request id. The frontend keeps
no other state.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import gevent
import zmq.green as zmq
from gevent.event import AsyncResult, Event
from gevent.queue import Empty, Queue
from gevent.socket import wait_read

from mservd import protocol


class ControllerGone(Exception):
    """No answer from the controller in time: it is stopping or has died."""


class ClientGone(Exception):
    """The HTTP client closed its connection before its answer was ready."""


# Most answers come sooner than this; only requests that wait longer pay for a watcher on the
# client's socket, so a client that goes away stops holding a place in the queue.
PATIENCE = 0.05


class Reply:
    """An answer. A streamed one has ``stream``: the bodies of the later parts, final one last;
    ``status``, ``content_type`` and ``headers`` are then those of the first part."""

    __slots__ = ("status", "content_type", "headers", "body", "stream")

    def __init__(self, status: int, content_type: str, headers: dict[str, str], body: bytes,
                 stream: Any = None):
        self.status = status
        self.content_type = content_type
        self.headers = headers
        self.body = body
        self.stream = stream


class Bridge:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._pid = 0
        self._sock: Any = None
        self._waiting: dict[bytes, AsyncResult] = {}

    def _socket(self):
        # created lazily, after gunicorn forked this worker: a ZMQ context never crosses a fork
        if self._pid != os.getpid():
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.connect(self.endpoint)
            self._sock = sock
            self._waiting = {}
            self._pid = os.getpid()
            gevent.spawn(self._read_replies)
        return self._sock

    def _read_replies(self) -> None:
        sock = self._sock
        while True:
            frames = sock.recv_multipart()
            if len(frames) < 4 or frames[0] not in (protocol.REPLY, protocol.CHUNK):
                continue
            waiter = self._waiting.get(frames[1])
            if waiter is None:
                continue  # the client gave up; the answer has nowhere to go
            if frames[0] == protocol.REPLY:
                del self._waiting[frames[1]]
                if type(waiter) is AsyncResult:
                    waiter.set(frames)
                else:
                    waiter.put(frames)  # the end of a streamed answer
            elif type(waiter) is AsyncResult:  # the first streamed part: switch to a queue
                parts = Queue()
                parts.put(frames)
                self._waiting[frames[1]] = parts
                waiter.set(parts)
            else:
                waiter.put(frames)

    def call(self, rid: bytes, frames: list[bytes], timeout: float,
             client: socket.socket | None = None, stream: bool = False) -> Reply:
        """Send a request and wait for its answer; with ``client``, give up if it goes away.

        A handler may stream: with ``stream`` the reply carries the later parts as an iterator
        (see :meth:`_parts`); without, the intermediate parts are dropped and the final answer
        is returned.
        """
        sock = self._socket()
        waiter = AsyncResult()
        self._waiting[rid] = waiter
        streaming = False
        try:
            sock.send_multipart(frames)
            try:
                got = waiter.get(timeout=PATIENCE if client is not None else timeout)
            except gevent.Timeout:
                if client is None:
                    raise
                got = self._wait_watching(rid, waiter, client, timeout - PATIENCE)
            if type(got) is Queue:
                if stream:
                    first = got.get()
                    streaming = True
                    status, content_type, headers = protocol.unpack_reply(first[2])
                    return Reply(status, content_type, headers, first[3],
                                 self._parts(rid, got, first, timeout))
                got = self._last_part(got, timeout)
        except (gevent.Timeout, Empty):
            raise ControllerGone(f"No answer from the controller within {timeout:.0f} s.") from None
        finally:
            if not streaming:
                self._waiting.pop(rid, None)
        status, content_type, headers = protocol.unpack_reply(got[2])
        return Reply(status, content_type, headers, got[3])

    @staticmethod
    def _last_part(parts: Queue, timeout: float) -> list[bytes]:
        while True:
            got = parts.get(timeout=timeout)
            if got[0] == protocol.REPLY:
                return got

    def _parts(self, rid: bytes, parts: Queue, first: list[bytes], timeout: float):
        """The bodies of a streamed answer after the first; ends with the final answer's."""
        try:
            if first[0] == protocol.REPLY:
                return
            while True:
                try:
                    got = parts.get(timeout=timeout)
                except Empty:
                    return  # the worker went quiet: the stream just ends
                yield got[3]
                if got[0] == protocol.REPLY:
                    return
        finally:
            self._waiting.pop(rid, None)

    def _wait_watching(self, rid: bytes, waiter: AsyncResult, client: socket.socket,
                       timeout: float) -> list[bytes]:
        gone = Event()

        def watch() -> None:
            try:
                wait_read(client.fileno())
                if client.recv(1, socket.MSG_PEEK) == b"":
                    gone.set()
            except OSError:
                gone.set()

        watcher = gevent.spawn(watch)
        try:
            gevent.wait([waiter, gone], count=1, timeout=timeout)
        finally:
            watcher.kill(block=False)
        if waiter.ready():
            return waiter.get()
        if gone.is_set():
            self._sock.send_multipart([protocol.CANCEL, rid])
            raise ClientGone()
        raise gevent.Timeout()

    def manage(self, op: str, args: dict[str, Any], token: str | None, timeout: float,
               api: str = protocol.API_MANAGEMENT) -> Reply:
        rid = uuid.uuid4().hex.encode()
        header = protocol.packb({"id": rid, "op": op, "args": args, "token": token, "api": api})
        return self.call(rid, [protocol.MANAGE, header], timeout)


def bearer_token(environ: dict[str, Any]) -> str | None:
    value = environ.get("HTTP_AUTHORIZATION")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
