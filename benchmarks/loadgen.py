"""A small asyncio HTTP/1.1 load generator for loopback benchmarks.

Raw HTTP/1.1 over keep-alive connections (an ``asyncio.Protocol`` per connection, requests
pre-rendered to bytes), because general-purpose clients (aiohttp, httpx) spend more CPU per
request than a fast server does on a 2-core machine, and the client would be what is measured.
For the same reason each answer is handled in its connection's ``data_received``, which sends
the next request there and then: no task, future or timer per request (timeouts are found by a
sweep a few times a second), and an answer whose bytes were already checked right for the same
request is not parsed again. Beside mservd that takes ~40 % off the client's CPU per request
(CPU the server would otherwise have shared its cores with).

Two modes:

- **closed loop** (:func:`closed_loop`): ``concurrency`` connections, each sending its next
  request as soon as the previous answer arrived;
- **open loop** (:func:`open_loop`): requests arrive as a Poisson process at ``rate`` per
  second, each sent on a free connection of a pool; one that finds no free connection is not
  sent and is counted as client-side ``backlog``. Latency is measured from the *scheduled*
  arrival, so a late sender shows up as latency (no coordinated omission); the arrivals due
  within the timers' millisecond are sent together, and one sent before its time counts from
  its send.

Both are bounded by a number of requests and by seconds. Every answer goes through the
workload's ``check(index, status, body)``, which returns None for a correct answer and a short
reason otherwise; a 2xx with a wrong body counts as the error ``bad_answer``, not as completed.

``python -m benchmarks.loadgen URL --concurrency 64 --seconds 5`` runs a closed loop against any
URL (a GET, or a POST of ``--body``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

#: check(index of the request in the workload, HTTP status, body) -> None if right, else why.
Check = Callable[[int, int, bytes], "str | None"]
RIGHT_ANSWERS_KEPT = 4096  # (request, body) pairs remembered as checked right
# The event loop's timers fire to the millisecond (uvloop's): an open loop sends the arrivals
# due within this of now at once, rather than spin on timers that fire before their time.
TIMER_SLACK = 0.001


def install_fast_loop() -> str:
    """Use uvloop when it is installed (it roughly doubles the client's ceiling); the name."""
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def render_request(method: str, host: str, port: int, path: str, body: bytes = b"",
                   content_type: str | None = None,
                   headers: dict[str, str] | None = None) -> bytes:
    """One HTTP/1.1 keep-alive request as the bytes to write."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: keep-alive"]
    if content_type:
        lines.append(f"Content-Type: {content_type}")
    for key, value in (headers or {}).items():
        lines.append(f"{key}: {value}")
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Workload:
    """What to send (pre-rendered requests, used round-robin) and how to check each answer."""

    name: str
    host: str
    port: int
    requests: Sequence[bytes]
    check: Check

    @classmethod
    def post(cls, name: str, url: str, bodies: Sequence[bytes], content_type: str,
             check: Check, headers: dict[str, str] | None = None) -> Workload:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        path = parts.path or "/"
        reqs = [render_request("POST", host, port, path, b, content_type, headers) for b in bodies]
        return cls(name, host, port, reqs, check)

    @classmethod
    def get(cls, name: str, url: str, check: Check) -> Workload:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        return cls(name, host, port, [render_request("GET", host, port, parts.path or "/")], check)


@dataclass
class Result:
    workload: str
    mode: str  # "closed" or "open"
    concurrency: int  # connections (closed loop) or pool size (open loop)
    rate: float | None  # offered requests/s (open loop)
    seconds: float  # wall time from the first send to the last answer
    sent: int
    completed: int  # right answers
    errors: dict[str, int] = field(default_factory=dict)  # by status, or bad_answer/timeout/conn
    backlog: int = 0  # open loop: arrivals that found no free connection (never sent)
    throughput: float = 0.0  # right answers per second (closed loop: within its duration)
    p50_ms: float = float("nan")
    p90_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")
    error_p99_ms: float = float("nan")  # how fast errors (e.g. 503 refusals) came back
    error_max_ms: float = float("nan")
    first_error: str | None = None
    client_late_p99_ms: float = float("nan")  # open loop: the client's own lag in sending

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v)
                for k, v in asdict(self).items()}

    def line(self) -> str:
        errs = ",".join(f"{k}:{v}" for k, v in sorted(self.errors.items())) or "-"
        load = f"rate={self.rate:.0f}/s" if self.mode == "open" else f"c={self.concurrency}"
        extra = (f" backlog={self.backlog} late99={self.client_late_p99_ms:.1f}ms"
                 if self.mode == "open" else "")
        return (f"{self.workload:<28} {self.mode:<6} {load:<13} sent={self.sent:<6} "
                f"ok={self.completed:<6} err={errs}{extra} thr={self.throughput:8.1f}/s "
                f"p50={self.p50_ms:7.2f} p90={self.p90_ms:7.2f} p99={self.p99_ms:7.2f} "
                f"max={self.max_ms:7.2f} ms")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an ascending sequence; NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection with at most one request in flight; its answer (or
    its loss) goes straight to the driver from ``data_received``, with no task or future per
    request."""

    def __init__(self, driver: _Driver) -> None:
        self.driver = driver
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.closed = False
        self.idx = -1  # the request in flight, -1 when none
        self.started = 0.0  # when its latency counts from (open loop: its scheduled arrival)
        self.sent_at = 0.0  # when it was written: its timeout counts from here
        # parse state of the current answer
        self._status = 0
        self._need = -1  # body bytes still expected; -1 while reading the head
        self._chunked = False
        self._close_after = False

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.idx >= 0:
            self.idx = -1
            self.driver.failed(self, "conn", f"connection: {exc or 'closed by server'}")

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.idx >= 0:
            self._answer()

    def _answer(self) -> None:
        try:
            answer = self._parse()
        except Exception as exc:  # a malformed answer fails this request
            self.idx = -1
            self.close()
            self.driver.failed(self, "conn", f"connection: bad response: {exc}")
            return
        if answer is not None:
            idx, self.idx = self.idx, -1
            if self._close_after:
                self.close()
            self.driver.answered(self, idx, *answer)

    # -- parsing -------------------------------------------------------------------------
    def _parse(self) -> tuple[int, bytes] | None:
        buf = self.buf
        if self._need < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return None
            head = bytes(buf[:end]).decode("latin-1")
            del buf[:end + 4]
            lines = head.split("\r\n")
            self._status = int(lines[0].split(" ", 2)[1])
            length = None
            self._chunked = False
            self._close_after = lines[0].startswith("HTTP/1.0")
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "transfer-encoding" and "chunked" in value.lower():
                    self._chunked = True
                elif name == "connection":
                    v = value.strip().lower()
                    self._close_after = v == "close" or (self._close_after and v != "keep-alive")
            if self._chunked:
                self._need = 0
            elif length is None:
                # body until close: only valid when the server closes the connection
                self._close_after = True
                self._need = 1 << 62
            else:
                self._need = length
        if self._chunked:
            return self._parse_chunked()
        if len(buf) >= self._need:
            body = bytes(buf[:self._need])
            del buf[:self._need]
            self._need = -1
            return self._status, body
        return None

    def _parse_chunked(self) -> tuple[int, bytes] | None:
        buf = self.buf
        body = bytearray()
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
            start = eol + 2
            if size == 0:
                end = buf.find(b"\r\n", start)  # no trailers expected
                if end < 0:
                    return None
                del buf[:end + 2]
                self._need = -1
                self._chunked = False
                return self._status, bytes(body)
            if len(buf) < start + size + 2:
                return None
            body += buf[start:start + size]
            pos = start + size + 2

    # -- use -----------------------------------------------------------------------------
    def send(self, idx: int, data: bytes, started: float, now: float) -> None:
        assert self.transport is not None
        self.idx, self.started, self.sent_at = idx, started, now
        self.transport.write(data)
        if self.buf:  # bytes that came before the request: the server spoke out of turn
            self._answer()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Driver:
    """Sends requests on connections and records their answers, calling ``then(conn)`` once
    each request is over (``conn`` the connection to reuse, or None when it was lost).

    A request costs the client a write, a parse and a check: no task, future or timer of its
    own. Timeouts are found by a sweep a few times a second, and a connection is only opened
    in a task (once per pool slot, and again after a failure)."""

    def __init__(self, workload: Workload, rec: _Recorder, timeout: float,
                 then: Callable[[_Conn | None], None]) -> None:
        self.workload = workload
        self.rec = rec
        self.timeout = timeout
        self.then = then
        self.loop = asyncio.get_running_loop()
        self.in_flight: set[_Conn] = set()
        self.connecting = 0
        self._sweeper = self.loop.call_later(self._sweep_every(), self._sweep)

    def _sweep_every(self) -> float:
        return max(0.02, min(0.25, self.timeout / 4))

    async def connect(self) -> _Conn:
        _, conn = await self.loop.create_connection(lambda: _Conn(self), self.workload.host,
                                                    self.workload.port)
        return conn

    def send(self, conn: _Conn | None, idx: int, started: float) -> None:
        """Send request ``idx`` on ``conn``, first opening a connection if it has none."""
        requests = self.workload.requests
        self.rec.sent += 1
        if conn is None or conn.closed:
            self.connecting += 1
            self.loop.create_task(self._connect_and_send(idx, requests[idx % len(requests)],
                                                         started))
            return
        conn.send(idx, requests[idx % len(requests)], started, time.perf_counter())
        self.in_flight.add(conn)

    async def _connect_and_send(self, idx: int, data: bytes, started: float) -> None:
        failure = None
        try:
            conn = await asyncio.wait_for(self.connect(), self.timeout)
        except TimeoutError:
            failure = ("timeout", f"no connection within {self.timeout} s")
        except OSError as exc:
            failure = ("conn", f"connection: {exc}")
        else:
            if conn.closed:  # taken and dropped at once (a server at its connection limit)
                failure = ("conn", "connection: closed by server before the request")
        self.connecting -= 1  # before the failure's then(): it may find the run over
        if failure is not None:
            self._over(None, failure[0], started, failure[1])
            return
        conn.send(idx, data, started, time.perf_counter())
        self.in_flight.add(conn)

    def answered(self, conn: _Conn, idx: int, status: int, body: bytes) -> None:
        now = time.perf_counter()
        self.in_flight.discard(conn)
        self.rec.record(idx, status, body, now - conn.started, now)
        self.then(None if conn.closed else conn)

    def failed(self, conn: _Conn, kind: str, detail: str) -> None:
        self.in_flight.discard(conn)
        self._over(conn, kind, conn.started, detail)

    def _over(self, conn: _Conn | None, kind: str, started: float, detail: str) -> None:
        self.rec.error(kind, time.perf_counter() - started, detail)
        if conn is not None:
            conn.close()
        self.then(None)

    def _sweep(self) -> None:
        now = time.perf_counter()
        for conn in [c for c in self.in_flight if now - c.sent_at > self.timeout]:
            conn.idx = -1  # its loss is this timeout, not a second error
            self.failed(conn, "timeout", f"no answer within {self.timeout} s")
        self._sweeper = self.loop.call_later(self._sweep_every(), self._sweep)

    @property
    def busy(self) -> bool:
        return bool(self.in_flight) or self.connecting > 0

    def stop(self) -> None:
        self._sweeper.cancel()


class _Recorder:
    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.ok: list[float] = []
        self.ok_at: list[float] = []  # when each right answer came (perf_counter)
        self.err_lat: list[float] = []
        self.errors: Counter[str] = Counter()
        self.sent = 0
        self.first_error: str | None = None
        self.late: list[float] = []  # open loop: how long after its arrival a request was sent
        # (request, body) pairs the check passed: the same bytes for the same request are
        # right again without parsing them again (a check sees only these two and the status)
        self._right: set[tuple[int, bytes]] = set()

    def record(self, idx: int, status: int, body: bytes, seconds: float,
               now: float | None = None) -> None:
        if 200 <= status < 300:
            key = (idx % len(self.workload.requests), body)
            why = None if key in self._right else self.workload.check(idx, status, body)
            if why is None:
                if len(self._right) < RIGHT_ANSWERS_KEPT:
                    self._right.add(key)
                self.ok.append(seconds)
                self.ok_at.append(time.perf_counter() if now is None else now)
                return
            self.error("bad_answer", seconds, f"{why}: {body[:200]!r}")
        else:
            self.error(str(status), seconds, f"{status}: {body[:200]!r}")

    def error(self, kind: str, seconds: float | None, detail: str) -> None:
        self.errors[kind] += 1
        if seconds is not None:
            self.err_lat.append(seconds)
        if self.first_error is None:
            self.first_error = detail

    def result(self, mode: str, concurrency: int, rate: float | None, seconds: float,
               backlog: int = 0, window: tuple[float, float] | None = None) -> Result:
        """``window`` (start, end): throughput counts the right answers that came within it,
        per second of it, instead of all of them over ``seconds``."""
        ok = sorted(self.ok)
        if window is not None and window[1] > window[0]:
            start, end = window
            throughput = sum(1 for t in self.ok_at if t <= end) / (end - start)
        else:
            throughput = len(ok) / seconds if seconds > 0 else 0.0
        err = sorted(self.err_lat)
        ms = 1000.0
        return Result(
            workload=self.workload.name, mode=mode, concurrency=concurrency, rate=rate,
            seconds=round(seconds, 3), sent=self.sent, completed=len(ok),
            errors=dict(self.errors), backlog=backlog,
            throughput=throughput,
            p50_ms=percentile(ok, 50) * ms, p90_ms=percentile(ok, 90) * ms,
            p99_ms=percentile(ok, 99) * ms, max_ms=(ok[-1] * ms) if ok else float("nan"),
            error_p99_ms=percentile(err, 99) * ms, error_max_ms=(err[-1] * ms) if err else float("nan"),
            first_error=self.first_error,
            client_late_p99_ms=percentile(sorted(self.late), 99) * ms,
        )



async def closed_loop_async(workload: Workload, concurrency: int, seconds: float,
                            max_requests: int | None = None, timeout: float = 30.0) -> Result:
    rec = _Recorder(workload)
    limit = max_requests if max_requests is not None else 1 << 62
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    active = concurrency  # connections still sending

    def then(conn: _Conn | None) -> None:
        """One request is over: its connection sends the next, or stops after the deadline."""
        nonlocal active
        now = time.perf_counter()
        if now < deadline and rec.sent < limit:
            driver.send(conn, rec.sent, now)  # requests are numbered in the order sent
            return
        if conn is not None:
            conn.close()
        active -= 1
        if active == 0 and not finished.done():
            finished.set_result(None)

    driver = _Driver(workload, rec, timeout, then)
    try:
        conns = await asyncio.gather(*(driver.connect() for _ in range(concurrency)))
        t0 = time.perf_counter()
        deadline = t0 + seconds
        for conn in conns:
            if rec.sent < limit:
                driver.send(conn, rec.sent, time.perf_counter())
            else:
                conn.close()
                active -= 1
        if active > 0:
            await finished
    finally:
        driver.stop()
    # Throughput is the steady state's: the answers that came while every connection was kept
    # busy. After the deadline no connection sends again, and the last answers trickle in from
    # a draining queue (seconds of it for a slow model at c=64), which is not the server's rate.
    end = time.perf_counter()
    return rec.result("closed", concurrency, None, end - t0, window=(t0, min(end, deadline)))


async def open_loop_async(workload: Workload, rate: float, seconds: float,
                          max_requests: int | None = None, pool: int = 256,
                          timeout: float = 30.0, seed: int = 1) -> Result:
    rec = _Recorder(workload)
    limit = max_requests if max_requests is not None else 1 << 62
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    # Connections open on first use: an idle open connection would block a server that
    # serves one connection at a time (a gunicorn sync worker) until it sends something.
    idle: list[_Conn | None] = [None] * pool
    backlog = 0
    arrivals = 0
    arriving = True
    t0 = time.perf_counter()
    next_at = t0 + rng.expovariate(rate)

    def finish_if_done() -> None:
        if not arriving and not driver.busy and not finished.done():
            finished.set_result(None)

    def then(conn: _Conn | None) -> None:
        idle.append(conn)
        finish_if_done()

    def arrive() -> None:
        """Every arrival due by now, each on a free connection (or counted as backlog), then
        a timer for the next one."""
        nonlocal arrivals, backlog, next_at, arriving
        now = time.perf_counter()
        while True:
            if arrivals >= limit or next_at - t0 >= seconds:
                arriving = False
                finish_if_done()
                return
            if next_at > now + TIMER_SLACK:
                break
            arrivals += 1
            if idle:
                rec.late.append(max(0.0, now - next_at))
                # latency from the arrival, or from the send when the timer woke a little early
                driver.send(idle.pop(), arrivals - 1, min(next_at, now))
            else:
                backlog += 1
            next_at += rng.expovariate(rate)
        loop.call_at(loop.time() + (next_at - now), arrive)

    driver = _Driver(workload, rec, timeout, then)
    try:
        arrive()
        await finished
    finally:
        driver.stop()
    for conn in idle:
        if conn is not None:
            conn.close()
    return rec.result("open", pool, rate, time.perf_counter() - t0, backlog)


def closed_loop(workload: Workload, concurrency: int, seconds: float,
                max_requests: int | None = None, timeout: float = 30.0) -> Result:
    with _no_collection_pauses():
        return asyncio.run(closed_loop_async(workload, concurrency, seconds, max_requests,
                                             timeout))


def open_loop(workload: Workload, rate: float, seconds: float, max_requests: int | None = None,
              pool: int = 256, timeout: float = 30.0, seed: int = 1) -> Result:
    with _no_collection_pauses():
        return asyncio.run(open_loop_async(workload, rate, seconds, max_requests, pool, timeout,
                                           seed))


@contextlib.contextmanager
def _no_collection_pauses() -> Iterator[None]:
    """No garbage collection while load runs. The benchmark process also holds torch and the
    models (for the in-process limit and the expected answers); a full collection walks all of
    it and stalls the client for 100 ms or more, which it would report as the latency of the
    server it is measuring. What the run leaves behind is collected after it."""
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
        gc.collect()


def check_status_only(idx: int, status: int, body: bytes) -> str | None:
    return None


def check_equals(expected: bytes) -> Check:
    def check(idx: int, status: int, body: bytes) -> str | None:
        return None if body == expected else "unexpected body"
    return check


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="closed- or open-loop HTTP load on one URL")
    parser.add_argument("url")
    parser.add_argument("--concurrency", "-c", type=int, default=64)
    parser.add_argument("--rate", type=float, help="open loop at this many requests/s")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--requests", type=int)
    parser.add_argument("--body", help="POST this body")
    parser.add_argument("--content-type", default="application/json")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    loop = install_fast_loop()
    if not args.json:
        print("event loop:", loop)
    if args.body is not None:
        work = Workload.post("cli", args.url, [args.body.encode()], args.content_type,
                             check_status_only)
    else:
        work = Workload.get("cli", args.url, check_status_only)
    if args.rate:
        result = open_loop(work, args.rate, args.seconds, args.requests, pool=args.concurrency)
    else:
        result = closed_loop(work, args.concurrency, args.seconds, args.requests)
    print(json.dumps(result.as_dict()) if args.json else result.line())


if __name__ == "__main__":
    main()
