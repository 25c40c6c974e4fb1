"""The inference port's own HTTP server: pipelining, hostile requests, idle connections, and
overload refused at once instead of queued."""

from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
import requests
from conftest import wait_until

ECHO = '{model_name="echo",model_version="1.0"}'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    daemon = Daemon(tmp_path_factory.mktemp("inference-server"), store,
                    {"load_models": "echo.mar"})
    daemon.start()
    yield daemon
    daemon.stop()


def connect(daemon) -> socket.socket:
    url = urlsplit(daemon.url("inference", "/"))
    return socket.create_connection((url.hostname, url.port), timeout=30)


def read_answers(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` HTTP/1.1 answers with Content-Length bodies, in the order they came."""
    data = b""
    answers = []
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(answers)} answers"
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers["content-length"])
        while len(data) < length:
            data += sock.recv(65536)
        answers.append((int(status_line.split()[1]), headers, data[:length]))
        data = data[length:]
    return answers


def post(path: str, body: bytes, key: str | None) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {key}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_pipelined_requests_on_one_connection_are_answered_in_order(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar", "default_workers_per_model": 2})
    with connect(daemon) as sock:
        bodies = [json.dumps({"n": n, "sleep": 0.2 if n == 0 else 0}).encode() for n in range(3)]
        key = daemon.key("inference")
        sock.sendall(b"".join(post("/predictions/echo", body, key) for body in bodies))
        answers = read_answers(sock, 3)
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert [json.loads(body)["echo"]["n"] for _, _, body in answers] == [0, 1, 2]


def test_a_malformed_request_gets_a_json_400_and_the_connection_closes(daemon) -> None:
    with connect(daemon) as sock:
        sock.sendall(b"POST /predictions/echo HTTP/1.1\r\nContent-Length: nope\r\n\r\n")
        [(status, headers, body)] = read_answers(sock, 1)
        assert sock.recv(1) == b""
    assert status == 400
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["type"] == "BadRequestException"


def test_an_overlong_url_is_414_and_oversized_headers_431_both_as_json(daemon) -> None:
    for request, code in [
        (f"GET /{'a' * 9000} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), 414),
        (b"GET /ping HTTP/1.1\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000)
                                              for i in range(80)) + b"\r\n", 431),
    ]:
        with connect(daemon) as sock:
            sock.sendall(request)
            [(status, _headers, body)] = read_answers(sock, 1)
        assert status == code
        assert json.loads(body)["code"] == code


def test_a_silent_connection_is_closed_after_the_keepalive_time(daemon) -> None:
    with connect(daemon) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        [(status, _, _)] = read_answers(sock, 1)
        assert status == 200
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server hung up on the idle connection
    # kept open through a pause, then closed at the keepalive deadline (5 s), not never
    assert 3.0 < time.monotonic() - started < 25.0


DOOR_ROUTES = {  # route: (path, how its body wraps one request, where its error says why)
    "torchserve": ("/predictions/echo", lambda body: body, "message"),
    "kserve_v1": ("/v1/models/echo:predict", lambda body: {"instances": [body]}, "error"),
}


@pytest.mark.parametrize("route", DOOR_ROUTES)
def test_a_fast_model_gets_no_more_in_flight_than_it_answers_in_the_wait(daemon_factory,
                                                                          route) -> None:
    # every request through the controller's queue: the test knows what is in flight by its
    # count, which a lent worker's requests reach only once answered
    daemon = daemon_factory({"load_models": "echo.mar", "batch_size": 1,
                             "default_workers_per_model": 2, "frontend_workers": 1,
                             "max_queue_wait_ms": 100, "lend_idle_workers": "false"})
    path, wrap, why = DOOR_ROUTES[route]
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {daemon.key('inference')}"
    url = daemon.url("inference", path)
    for n in range(3):  # quick answers: echo is a fast model, one the frontend may limit
        assert session.post(url, json=wrap({"n": n}), timeout=10).status_code == 200

    def slow(out: list, sleep: float, count: int = 1) -> None:
        with requests.Session() as own:
            own.headers.update(session.headers)
            for _ in range(count):
                out.append(own.post(url, json=wrap({"sleep": sleep}), timeout=60))

    accepted = daemon.metrics()[f"ts_inference_requests_total{ECHO}"]
    warm: list = []  # its answers slow down, and it answers a few a second at best
    threads = [threading.Thread(target=slow, args=(warm, 0.6, 5)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # so all it may have in flight here is the floor: 8. The held requests follow at once: an
    # idle model's lateness fades (by 0.9 each 5 ms), and once it is under a third of the wait
    # the door has no ceiling; from 0.6 s that takes ~140 ms of idleness
    held: list = []
    threads = [threading.Thread(target=slow, args=(held, 1.0)) for _ in range(8)]
    for thread in threads:
        thread.start()
    wait_until(lambda: daemon.metrics()[f"ts_inference_requests_total{ECHO}"] >= accepted + 18,
               30, "the 8 held requests to reach echo's queue", details=daemon.logs)
    started = time.monotonic()
    refused = session.post(url, json=wrap({"n": "one more"}), timeout=10)
    took = time.monotonic() - started
    for thread in threads:
        thread.join()
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"] == "1"
    assert "8 of its predictions are in flight from this frontend" in refused.json()[why]
    assert "x-request-id" not in refused.headers  # it never reached the controller
    assert took < 2.0  # refused at once: behind the held ones it would wait 4 s
    assert [r.status_code for r in warm] == [200] * 10
    assert sorted(r.status_code for r in held) == [200] * 8  # those let in are all answered
    after = session.post(url, json=wrap({"n": "after"}), timeout=10)
    assert after.status_code == 200  # answered, nothing in flight: let in again


def test_a_queue_that_stands_still_refuses_new_requests_at_once(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar", "batch_size": 1,
                             "max_queue_wait_ms": 100})
    slow = []

    def send(body: dict) -> None:
        slow.append(daemon.predict("echo", json=body, timeout=60))

    # the first request holds the only worker for 6 s (the rest below fits in it on a slow
    # minute); the second queues behind it
    threads = [threading.Thread(target=send, args=(body,))
               for body in ({"sleep": 6.0, "n": 0}, {"n": 1})]
    mark = daemon.log_end("model_echo.log")
    threads[0].start()
    daemon.wait_for_log("model_echo.log", "echo sleeping", since=mark)
    threads[1].start()
    wait_until(lambda: daemon.metrics().get(f"mservd_pending_requests{ECHO}") == 1, 30,
               "the second request to queue behind the first", details=daemon.logs)
    # the refusal is about time the queue stood still (max_batch_delay 100 ms + 100 ms): that
    # time has to pass on the daemon's own clock, so here it does, from the moment it began
    time.sleep(0.4)
    started = time.monotonic()
    refused = daemon.predict("echo", json={"n": "late"})
    took = time.monotonic() - started
    # right after a refusal the frontend refuses that model itself for a moment: the answers
    # are the same, but they never reach the controller (no request id was made for them)
    # pipelined on one connection: each is read as the one before it is refused, so some land
    # within a hold (20 ms) of a refusal however slow the minute
    with connect(daemon) as sock:
        body = json.dumps({"n": "again"}).encode()
        sock.sendall(post("/predictions/echo", body, daemon.key("inference")) * 10)
        again = read_answers(sock, 10)
    for thread in threads:
        thread.join()
    assert [status for status, _, _ in again] == [503] * 10
    assert {json.loads(body)["type"] for _, _, body in again} == {"QueueFullException"}
    assert any("x-request-id" not in headers for _, headers, _ in again)
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"] == "1"
    assert "overloaded" in refused.json()["message"]
    assert took < 1.5  # refused at once, not queued behind seconds more of work
    assert sorted(answer.status_code for answer in slow) == [200, 200]  # the queued still run
    after = daemon.predict("echo", json={"n": "after"})
    assert after.status_code == 200  # the queue moved again: requests are taken again
    assert requests.get(daemon.url("inference", "/ping"), timeout=10).status_code == 200


def test_connections_are_spread_over_the_workers_and_a_dead_one_is_replaced(
        daemon_factory) -> None:
    import os
    import signal

    import psutil
    from conftest import http_workers, wait_until

    daemon = daemon_factory({"frontend_workers": 2})
    port = urlsplit(daemon.url("inference", "/")).port
    workers = http_workers(daemon)
    assert len(workers) == 2
    ping = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
    socks = [connect(daemon) for _ in range(32)]
    for sock in socks:
        sock.sendall(ping)
    for sock in socks:
        assert read_answers(sock, 1)[0][0] == 200

    def held(worker: psutil.Process) -> int:
        return sum(1 for c in worker.net_connections(kind="tcp")
                   if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)

    # each worker its own listener on the one port: the kernel deals connections out evenly
    # (fewer than 4 of 32 on one side has odds of about one in a million)
    assert min(held(w) for w in workers) >= 4, [held(w) for w in workers]
    for sock in socks:
        sock.close()

    def listens(worker: psutil.Process) -> bool:
        """Whether ``worker`` holds a listener on the inference port. Asked of the process:
        the system's list names one holder of a socket, and the arbiter holds them all."""
        try:
            return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN
                       for c in worker.net_connections(kind="tcp"))
        except psutil.Error:  # gone meanwhile
            return False

    def replaced() -> bool:
        now = http_workers(daemon)
        return (len(now) == 2 and workers[0].pid not in {w.pid for w in now}
                and all(listens(w) for w in now))

    assert all(listens(w) for w in workers)
    os.kill(workers[0].pid, signal.SIGKILL)  # gunicorn replaces it
    wait_until(replaced, 30, "the killed worker's replacement to hold a listener")
    for _ in range(16):  # every new connection is answered
        with connect(daemon) as sock:
            sock.sendall(ping)
            assert read_answers(sock, 1)[0][0] == 200


def test_connections_queued_for_a_worker_that_dies_are_answered_by_its_replacement(
        daemon_factory) -> None:
    import os
    import signal

    from conftest import http_workers

    daemon = daemon_factory({"frontend_workers": 2})
    workers = http_workers(daemon)
    assert len(workers) == 2
    # a hung worker (its loop stopped; gunicorn kills it after frontend_timeout): the kernel
    # still deals it its share of new connections, which wait in its listener's queue
    os.kill(workers[0].pid, signal.SIGSTOP)
    socks = []
    try:
        for _ in range(16):  # all 16 dealt to the live worker has odds of 1 in 65536
            sock = connect(daemon)
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(sock)
    finally:
        os.kill(workers[0].pid, signal.SIGKILL)
    # the queued connections were never the dead worker's: its replacement answers them
    for sock in socks:
        with sock:
            assert read_answers(sock, 1)[0][0] == 200
