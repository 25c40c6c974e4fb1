"""The HTTP frontend's door, in one process: what a model's limit lets in is counted when it is
let in, so the requests read in one turn of the event loop cannot all pass the same check."""

from __future__ import annotations

import asyncio
import json

from mservd.frontends.http.server import Connection, HttpServer
from mservd.frontends.http.shedding import ModelLimit


class Transport:
    """The socket side of a connection: what the server wrote to it."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str):
        return ("127.0.0.1", 40000)

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def request(body: bytes = b'{"x": 1}') -> bytes:
    return (b"POST /predictions/m HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def test_requests_read_in_one_turn_are_counted_as_they_are_let_in() -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        server = HttpServer({"controller": "ipc:///nonexistent/frontend.sock",
                             "max_request_size": 1 << 20, "reply_timeout": 10, "auth": False,
                             "max_queue_wait_ms": 50, "listeners": {}}, loop)
        limit = server.limits["/predictions/m"] = ModelLimit(0.05)
        limit.allowed = 2  # as if its ticks had set it: two in flight from this process
        transports = [Transport() for _ in range(3)]
        for transport in transports:  # three connections, each one request, in one turn
            conn = Connection(server, "inference")
            conn.connection_made(transport)
            conn.data_received(request())
        assert limit.busy == 2  # no task has run yet, and the first two count already
        assert transports[0].written == transports[1].written == []  # let in: awaiting answers
        [answer] = transports[2].written
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
        refusal = json.loads(body)
        assert refusal["code"] == 503 and refusal["type"] == "ServiceUnavailableException"
        assert "2 of its predictions are in flight from this frontend" in refusal["message"]
        assert limit.refused == 1
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        server.bridge.close()
        loop.close()
        asyncio.set_event_loop(None)
