"""The management frontend's line to the controller: one DEALER socket per gunicorn worker.

Any number of greenlets (one per HTTP request) send on the shared socket; a single reader
greenlet receives replies and wakes the greenlet waiting on that request id. The frontend keeps
no other state. The asyncio frontends have their own (``async_bridge.py``); the answer types
both use live here.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import gevent
import zmq.green as zmq
from gevent.event import AsyncResult

from mservd import protocol


class ControllerGone(Exception):
    """No answer from the controller in time: it is stopping or has died."""


class ClientGone(Exception):
    """The HTTP client closed its connection before its answer was ready."""


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
            if len(frames) < 4 or frames[0] != protocol.REPLY:
                continue  # management answers are never streamed
            waiter = self._waiting.pop(frames[1], None)
            if waiter is not None:
                waiter.set(frames)

    def call(self, rid: bytes, frames: list[bytes], timeout: float) -> Reply:
        """Send a request and wait for its answer."""
        sock = self._socket()
        waiter = AsyncResult()
        self._waiting[rid] = waiter
        try:
            sock.send_multipart(frames)
            got = waiter.get(timeout=timeout)
        except gevent.Timeout:
            raise ControllerGone(f"No answer from the controller within {timeout:.0f} s.") from None
        finally:
            self._waiting.pop(rid, None)
        status, content_type, headers = protocol.unpack_reply(got[2])
        return Reply(status, content_type, headers, got[3])

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
