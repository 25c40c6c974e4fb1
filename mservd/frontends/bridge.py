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
    __slots__ = ("status", "content_type", "headers", "body")

    def __init__(self, status: int, content_type: str, headers: dict[str, str], body: bytes):
        self.status = status
        self.content_type = content_type
        self.headers = headers
        self.body = body


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
                waiter.set(frames)

    def call(self, rid: bytes, frames: list[bytes], timeout: float,
             client: socket.socket | None = None) -> Reply:
        """Send a request and wait for its answer; with ``client``, give up if it goes away."""
        sock = self._socket()
        waiter = AsyncResult()
        self._waiting[rid] = waiter
        try:
            sock.send_multipart(frames)
            try:
                got = waiter.get(timeout=PATIENCE if client is not None else timeout)
            except gevent.Timeout:
                if client is None:
                    raise
                got = self._wait_watching(rid, waiter, client, timeout - PATIENCE)
        except gevent.Timeout:
            raise ControllerGone(f"No answer from the controller within {timeout:.0f} s.") from None
        finally:
            self._waiting.pop(rid, None)
        status, content_type, headers = protocol.unpack_reply(got[2])
        return Reply(status, content_type, headers, got[3])

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
