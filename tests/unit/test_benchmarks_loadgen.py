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
