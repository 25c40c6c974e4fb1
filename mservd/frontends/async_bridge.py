"""The gRPC frontend's line to the controller: one asyncio DEALER socket, one reader task.

The same frames as the HTTP frontend's bridge (mservd/frontends/bridge.py), for grpc.aio: every
RPC coroutine sends on the one socket, which only the event loop's thread touches, and awaits
a future that the reader task resolves by request id. The frontend keeps no other state.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import zmq
import zmq.asyncio

from mservd import protocol
from mservd.frontends.bridge import ControllerGone, Reply

log = logging.getLogger(__name__)


class AsyncBridge:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: Any = None
        self._waiting: dict[bytes, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None

    def _socket(self) -> Any:
        if self._sock is None:
            self._ctx = zmq.asyncio.Context()
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.connect(self.endpoint)
            self._sock = sock
            self._reader = asyncio.get_running_loop().create_task(self._read_replies())
        return self._sock

    async def _read_replies(self) -> None:
        while True:
            frames = await self._sock.recv_multipart()
            if len(frames) < 4 or frames[0] != protocol.REPLY:
                continue  # streamed chunks are not relayed over gRPC
            waiter = self._waiting.pop(frames[1], None)
            if waiter is not None and not waiter.done():
                waiter.set_result(frames)

    async def call(self, rid: bytes, frames: list[bytes], timeout: float) -> Reply:
        sock = self._socket()
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[rid] = waiter
        try:
            await sock.send_multipart(frames)
            got = await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            raise ControllerGone(f"No answer from the controller within {timeout:.0f} s.") \
                from None
        finally:
            self._waiting.pop(rid, None)
        status, content_type, headers = protocol.unpack_reply(got[2])
        return Reply(status, content_type, headers, got[3])

    async def manage(self, op: str, args: dict[str, Any], token: str | None, timeout: float,
                     api: str = protocol.API_MANAGEMENT) -> Reply:
        rid = uuid.uuid4().hex.encode()
        header = protocol.packb({"id": rid, "op": op, "args": args, "token": token, "api": api})
        return await self.call(rid, [protocol.MANAGE, header], timeout)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._sock is not None:
            self._sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
