"""The benchmark load generator against its own trivial server: the numbers add up."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest

from benchmarks import loadgen
from benchmarks.trivial_server import serve
from benchmarks.workloads import tiny_check


@pytest.fixture(scope="module")
def trivial_port():
    ready = threading.Event()
    box: dict[str, object] = {}

    def run() -> None:
        loop = asyncio.new_event_loop()
        box["loop"] = loop

        def on_ready(port: int) -> None:
            box["port"] = port
            ready.set()

        try:
            loop.run_until_complete(serve(0, on_ready))
        except (asyncio.CancelledError, RuntimeError):
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield box["port"]
    loop = box["loop"]
    for task in asyncio.all_tasks(loop):  # type: ignore[arg-type]
        loop.call_soon_threadsafe(task.cancel)  # type: ignore[attr-defined]
    thread.join(5)


def _work(port: int, check=None) -> loadgen.Workload:
    return loadgen.Workload.post("trivial", f"http://127.0.0.1:{port}/predictions/x",
                                 [b"[1, 2]", b"[3]"], "application/json",
                                 check or loadgen.check_equals(b"[0.0]"))


def _consistent(r: loadgen.Result) -> None:
    assert r.sent == r.completed + sum(r.errors.values())
    assert r.p50_ms <= r.p90_ms <= r.p99_ms <= r.max_ms
    if r.mode == "open":
        assert r.throughput == pytest.approx(r.completed / r.seconds, rel=0.02)
    else:  # the answers within the run's duration, per second of it
        assert 0 < r.throughput <= r.completed / r.seconds * 1.3


def test_closed_loop_counts_add_up(trivial_port):
    r = loadgen.closed_loop(_work(trivial_port), concurrency=4, seconds=5, max_requests=400)
    assert r.sent == 400 and r.completed == 400 and r.errors == {}
    _consistent(r)


def test_closed_loop_bounded_by_seconds(trivial_port):
    r = loadgen.closed_loop(_work(trivial_port), concurrency=2, seconds=0.3)
    assert 0.25 < r.seconds < 2.0 and r.completed > 0
    _consistent(r)


def test_closed_loop_throughput_leaves_out_the_drain_after_its_duration():
    import time as clock

    rec = loadgen._Recorder(_work(1))
    start = clock.perf_counter()
    rec.ok = [0.1] * 12
    rec.ok_at = [start + 0.1 * i for i in range(1, 11)] + [start + 3.0, start + 4.0]
    r = rec.result("closed", 2, None, 4.0, window=(start, start + 1.0))
    assert r.completed == 12 and r.throughput == pytest.approx(10.0)  # not 12 / 4 s


def test_open_loop_counts_add_up(trivial_port):
    r = loadgen.open_loop(_work(trivial_port), rate=500, seconds=0.6, pool=16)
    assert r.mode == "open" and r.errors == {}
    assert 150 < r.sent + r.backlog < 500  # ~300 Poisson arrivals in 0.6 s
    _consistent(r)


def test_wrong_answers_are_errors_not_completions(trivial_port):
    r = loadgen.closed_loop(_work(trivial_port, loadgen.check_equals(b"[1.0]")), 2, 5,
                            max_requests=50)
    assert r.completed == 0 and r.errors == {"bad_answer": 50} and r.sent == 50
    assert math.isnan(r.p50_ms) and r.first_error and "unexpected body" in r.first_error


def test_refused_connection_counts_as_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    work = _work(port)
    r = asyncio.run(_open_only(work))
    assert r.completed == 0 and r.errors.get("conn", 0) == r.sent > 0


async def _open_only(work: loadgen.Workload) -> loadgen.Result:
    return await loadgen.open_loop_async(work, rate=200, seconds=0.2, pool=4, timeout=2)


def test_tiny_check_rejects_a_wrong_answer():
    expected = [[0.1 * i for i in range(10)]]
    check = tiny_check(expected)
    assert check(0, 200, json.dumps(expected[0]).encode()) is None
    off = list(expected[0])
    off[3] += 1e-3
    assert "expected" in check(0, 200, json.dumps(off).encode())
    assert check(0, 200, json.dumps(expected[0][:9]).encode()) == "not a list of 10"
    assert check(0, 200, b"oops") == "not JSON"


def test_percentile_nearest_rank():
    values = [float(i) for i in range(1, 101)]
    assert loadgen.percentile(values, 50) == 50.0
    assert loadgen.percentile(values, 99) == 99.0
    assert loadgen.percentile(values, 100) == 100.0
    assert math.isnan(loadgen.percentile([], 50))


def _serve_raw(answer: bytes | None):
    """A listener on 127.0.0.1 that reads each request and sends ``answer`` (then closes the
    connection), or never answers when ``answer`` is None; (port, stop)."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.1)
    stopping = threading.Event()
    held = []

    def serve() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
            if answer is not None:
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                    conn.sendall(answer)
                finally:
                    conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def stop() -> None:
        stopping.set()
        thread.join(5)
        listener.close()
        for conn in held:
            conn.close()

    return listener.getsockname()[1], stop


def test_a_request_never_answered_is_a_timeout_and_the_run_still_ends():
    import time as clock

    port, stop = _serve_raw(None)
    try:
        started = clock.perf_counter()
        closed = asyncio.run(loadgen.closed_loop_async(_work(port), 2, 0.3, timeout=0.2))
        opened = asyncio.run(loadgen.open_loop_async(_work(port), rate=50, seconds=0.3,
                                                     pool=4, timeout=0.2))
        assert clock.perf_counter() - started < 5
    finally:
        stop()
    for r in (closed, opened):
        assert r.completed == 0 and r.sent > 0 and r.errors == {"timeout": r.sent}
        assert r.error_p99_ms >= 200
        assert "no answer within 0.2 s" in r.first_error


def test_a_connection_the_server_closes_after_each_answer_is_opened_again():
    answer = (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n[0.0]")
    port, stop = _serve_raw(answer)
    try:
        r = loadgen.closed_loop(_work(port), concurrency=2, seconds=5, max_requests=20)
    finally:
        stop()
    assert r.sent == 20 and r.completed == 20 and r.errors == {}


def test_an_answer_checked_right_once_is_not_parsed_again_for_the_same_request():
    calls = []

    def check(idx: int, status: int, body: bytes) -> str | None:
        calls.append((idx, body))
        return None if body == b"[0.0]" else "wrong"

    rec = loadgen._Recorder(_work(1, check))  # two requests: index 0 and 1 (mod 2)
    for idx in (0, 2, 4):
        rec.record(idx, 200, b"[0.0]", 0.001)
    rec.record(1, 200, b"[0.0]", 0.001)  # another request: checked on its own
    rec.record(0, 200, b"[9.9]", 0.001)  # other bytes: checked, and wrong
    rec.record(0, 200, b"[9.9]", 0.001)  # a wrong answer is checked every time
    assert calls == [(0, b"[0.0]"), (1, b"[0.0]"), (0, b"[9.9]"), (0, b"[9.9]")]
    assert len(rec.ok) == 4 and rec.errors == {"bad_answer": 2}



def test_a_connection_dropped_as_it_opens_counts_as_an_error_and_the_run_ends(
        trivial_port, monkeypatch):
    """A server at its connection limit takes a connection and closes it before the request
    is written: the request is a connection error, not a write on a closed transport that
    nobody records."""
    opened = loadgen._Driver.connect

    async def dropped_as_it_opens(self):
        conn = await opened(self)
        conn.close()
        conn.closed = True  # as connection_lost, come before the request is written, sets it
        return conn

    monkeypatch.setattr(loadgen._Driver, "connect", dropped_as_it_opens)
    r = asyncio.run(loadgen.open_loop_async(_work(trivial_port), rate=100, seconds=0.2,
                                            pool=4, timeout=2))
    assert r.sent > 0 and r.completed == 0 and r.errors == {"conn": r.sent}
    assert "closed by server before the request" in r.first_error
