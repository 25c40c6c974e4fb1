"""A lent worker's job socket: the frontends it was lent to send their batches here."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Container
from typing import TYPE_CHECKING, Any

import zmq

from mservd import protocol

if TYPE_CHECKING:
    from mservd.worker.batches import Batches

log = logging.getLogger("mservd.worker")


class JobSocket:
    """A worker's job socket (``leases.py``): a Unix ``SOCK_SEQPACKET`` listener in the run
    folder, with a connection from each frontend the worker was lent to; each message on one
    is a leased BATCH (:func:`protocol.job_message`), answered on the same connection."""

    def __init__(self, listener: socket.socket, endpoint: str) -> None:
        self.listener = listener
        self.endpoint = endpoint
        self.conns: dict[int, socket.socket] = {}
        self.buffer = bytearray(protocol.JOB_MESSAGE_MAX)

    @classmethod
    def bind(cls, backend: str) -> JobSocket | None:
        """None where there is none (not ``ipc://``, or the bind fails): the worker is then
        never lent."""
        endpoint = protocol.job_endpoint(backend, os.getpid())
        if endpoint is None:
            return None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(endpoint[len("ipc://"):])
            listener.listen(64)
        except OSError as exc:
            log.warning("no job socket at %s (%s): this worker is never lent", endpoint, exc)
            listener.close()
            return None
        listener.setblocking(False)
        return cls(listener, endpoint)

    def run(self, batches: Batches, poller: zmq.Poller, ready: Container[Any] | None,
            limit: int | None) -> None:
        """Take new connections and run the leased batches waiting on those ``ready`` (file
        descriptors), up to ``limit`` each; ``ready`` None: every batch on every connection
        (a RECALL or STOP: those sent before the lease ended)."""
        if ready is None or self.listener.fileno() in ready:
            while True:
                try:
                    conn, _ = self.listener.accept()
                except OSError:  # none waiting
                    break
                conn.setblocking(False)
                self.conns[conn.fileno()] = conn
                poller.register(conn, zmq.POLLIN)
        for fd, conn in list(self.conns.items()):
            if ready is None or fd in ready:
                self._read(fd, conn, batches, poller, limit)

    def _read(self, fd: int, conn: socket.socket, batches: Batches, poller: zmq.Poller,
              limit: int | None) -> None:
        messages = protocol.read_job_messages(conn, self.buffer, _dropped)
        for done, frames in enumerate(messages, start=1):
            if frames is None:  # the frontend went
                poller.unregister(conn)
                del self.conns[fd]
                conn.close()
                return
            batches.leased(frames, conn)
            if limit is not None and done >= limit:
                return

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.endpoint[len("ipc://"):])


def _dropped(exc: protocol.ProtocolError) -> None:
    log.error("worker dropped a malformed leased message: %s", exc)
