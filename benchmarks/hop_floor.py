"""What a hop between processes costs on this machine: the floor under mservd's c=1 latency.

    .venv/bin/python -m benchmarks.hop_floor [--trips 5000]

A request to mservd crosses two ZeroMQ hops each way (frontend -> controller -> worker and
back), each between two Python processes over ``ipc://``, as ``mservd/protocol.py`` sends them.
This measures, with nothing else running in those processes, the median round trip of:

- a Unix socket pair between two processes (the kernel alone),
- one ZeroMQ hop (DEALER -> ROUTER echo),
- two ZeroMQ hops through a forwarding process (the frontend -> controller -> worker shape),

and the CPU the forwarding process spends per round trip. Compare the two-hop figure with the
naive Flask route's whole c=1 p50 in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time

import zmq

WARM_UP = 500


def _echo_pair(sock: socket.socket) -> None:
    while True:
        data = sock.recv(65536)
        if not data or data == b"stop":
            return
        sock.send(data)


def _echo_zmq(endpoint: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(b"hello")
    while True:
        frames = sock.recv_multipart()
        if frames[-1] == b"stop":
            return
        sock.send_multipart(frames)


def _forward(front_endpoint: str, back_endpoint: str, report) -> None:
    """A ROUTER on each side, as the controller has: frontends' messages to the one worker,
    its answers back; reports its CPU seconds per round trip."""
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    front.bind(front_endpoint)
    back = ctx.socket(zmq.ROUTER)
    back.bind(back_endpoint)
    worker, _ = back.recv_multipart()
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    began, trips = None, 0
    while True:
        events = dict(poller.poll(1000))
        if front in events:
            frames = front.recv_multipart()
            if frames[-1] == b"stop":
                back.send_multipart([worker, b"stop"])
                cpu = os.times()
                report.send((cpu.user + cpu.system - began) / max(1, trips))
                return
            trips += 1
            if began is None and trips == WARM_UP:  # the timed trips start here
                cpu = os.times()
                began, trips = cpu.user + cpu.system, 0
            back.send_multipart([worker, *frames])
        if back in events:
            front.send_multipart(back.recv_multipart()[1:])


def _time(send, recv, trips: int) -> float:
    """Median seconds of ``trips`` round trips after a warm-up."""
    took = []
    for i in range(WARM_UP + trips):
        start = time.perf_counter()
        send()
        recv()
        if i >= WARM_UP:
            took.append(time.perf_counter() - start)
    return statistics.median(took)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=5000)
    args = parser.parse_args(argv)
    mp.set_start_method("fork")
    tmp = tempfile.mkdtemp(prefix="hop-floor-")
    payload = b"x" * 300  # about a tiny request's size

    ours, theirs = socket.socketpair()
    echo = mp.Process(target=_echo_pair, args=(theirs,))
    echo.start()
    pair = _time(lambda: ours.send(payload), lambda: ours.recv(65536), args.trips)
    ours.send(b"stop")
    echo.join()

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"ipc://{tmp}/one.sock")
    echo = mp.Process(target=_echo_zmq, args=(f"ipc://{tmp}/one.sock",))
    echo.start()
    peer, _ = router.recv_multipart()
    one = _time(lambda: router.send_multipart([peer, b"route", payload]),
                router.recv_multipart, args.trips)
    router.send_multipart([peer, b"stop"])
    echo.join()

    result, report = mp.Pipe()
    middle = mp.Process(target=_forward, args=(f"ipc://{tmp}/front.sock",
                                               f"ipc://{tmp}/back.sock", report))
    middle.start()
    echo = mp.Process(target=_echo_zmq, args=(f"ipc://{tmp}/back.sock",))
    echo.start()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"ipc://{tmp}/front.sock")
    time.sleep(0.5)
    two = _time(lambda: dealer.send_multipart([b"route", payload]), dealer.recv_multipart,
                args.trips)
    dealer.send_multipart([b"stop"])
    forward_cpu = result.recv()
    middle.join()
    echo.join()
    dealer.close()
    router.close()
    ctx.term()

    print(f"load average {os.getloadavg()[0]:.2f}; {args.trips} round trips each, medians")
    print(f"Unix socket pair, two processes:        {pair * 1e6:7.0f} µs")
    print(f"one ZeroMQ hop (ipc), two processes:    {one * 1e6:7.0f} µs")
    print(f"two ZeroMQ hops through a forwarder:    {two * 1e6:7.0f} µs "
          f"(the forwarder's CPU: {forward_cpu * 1e6:.0f} µs per round trip)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
