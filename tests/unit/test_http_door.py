"""The HTTP frontend's door, in one process: what a model's limit lets in is counted when it is
let in, so the requests read in one turn of the event loop cannot all pass the same check."""

from __future__ import annotations

import asyncio
import contextlib
import json

from mservd.frontends.http.server import Connection, HttpServer, is_kserve_prediction
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


def request(body: bytes = b'{"x": 1}', path: bytes = b"/predictions/m") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (path, len(body))) + body


@contextlib.contextmanager
def frontend():
    """An HTTP frontend's server on its own event loop, never run: only the door acts."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = HttpServer({"controller": "ipc:///nonexistent/frontend.sock",
                         "max_request_size": 1 << 20, "reply_timeout": 10, "auth": False,
                         "max_queue_wait_ms": 50, "listeners": {}}, loop)
    try:
        yield server
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        server.bridge.close()
        loop.close()
        asyncio.set_event_loop(None)


def send(server: HttpServer, data: bytes) -> Transport:
    transport = Transport()
    conn = Connection(server, "inference")
    conn.connection_made(transport)
    conn.data_received(data)
    return transport


def test_requests_read_in_one_turn_are_counted_as_they_are_let_in() -> None:
    with frontend() as server:
        limit = server.limits["/predictions/m"] = ModelLimit(0.05)
        limit.allowed = 2  # as if its ticks had set it: two in flight from this process
        # three connections, each one request, in one turn
        transports = [send(server, request()) for _ in range(3)]
        assert limit.busy == 2  # no task has run yet, and the first two count already
        assert transports[0].written == transports[1].written == []  # let in: awaiting answers
        [answer] = transports[2].written
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
        refusal = json.loads(body)
        assert refusal["code"] == 503 and refusal["type"] == "ServiceUnavailableException"
        assert "2 of its predictions are in flight from this frontend" in refusal["message"]
        assert limit.refused == 1


def test_a_kserve_prediction_is_limited_at_the_door_and_refused_in_kserve_s_shape() -> None:
    with frontend() as server:
        limit = server.limits["/v2/models/m/infer"] = ModelLimit(0.05)
        limit.allowed = 1
        let_in = send(server, request(path=b"/v2/models/m/infer"))
        refused = send(server, request(path=b"/v2/models/m/infer"))
        assert limit.busy == 1 and let_in.written == []
        [answer] = refused.written
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
        assert list(json.loads(body)) == ["error"]  # what KServe and Triton clients read
        assert "1 of its predictions are in flight" in json.loads(body)["error"]


def test_only_prediction_routes_pass_the_door() -> None:
    assert is_kserve_prediction("/v2/models/m/infer")
    assert is_kserve_prediction("/v2/models/m/versions/2/infer")
    assert is_kserve_prediction("/v1/models/m:predict")
    assert is_kserve_prediction("/v1/models/m:explain")
    assert not is_kserve_prediction("/v2/models/m/ready")
    assert not is_kserve_prediction("/v2/models/m")
    assert not is_kserve_prediction("/v1/models/m")
