"""A real continuous-batching worker process streaming on its own: a sequence's parts and its
answer go to the frontend's reply socket, and the controller hears only that the stream began
(before its first part goes), the gaps between its parts, and that it ended (issue 47).

The test's sockets stand where the controller's backend socket and a frontend's reply socket
would be, in one run folder, as in ``test_worker_answers_directly.py``."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import zmq
from conftest import spawn_worker

from mservd import protocol


def start_continuous_worker(run_dir: Path, direct: bool) -> subprocess.Popen:
    return spawn_worker(run_dir, "steady_steps.py", continuous_batching=True,
                        direct_streams=direct)


def generation(rid: bytes, fid: bytes, tokens: int) -> list[bytes]:
    request = protocol.Request(rid, protocol.CODEC_TORCHSERVE, [("body", "application/json")],
                               {}, [json.dumps({"max_tokens": tokens}).encode()], fid=fid)
    return protocol.batch_of([request])


def received(sock: zmq.Socket, until: bytes, rid: bytes) -> list[list[bytes]]:
    """Messages on ``sock`` (METRICS left out) up to the one of kind ``until`` for ``rid``."""
    got: list[list[bytes]] = []
    while True:
        assert sock.poll(10_000), f"nothing more came; got {[m[0] for m in got]}"
        frames = sock.recv_multipart()
        if sock.type == zmq.ROUTER:
            frames = frames[1:]
        if frames[0] == protocol.METRICS:
            continue
        got.append(frames)
        if frames[0] == until and rid in frames[1:]:
            return got


class Sockets:
    def __init__(self, run_dir: Path) -> None:
        self.ctx = zmq.Context()
        self.controller = self.ctx.socket(zmq.ROUTER)
        self.controller.setsockopt(zmq.LINGER, 0)
        self.controller.bind(f"ipc://{run_dir}/backend.sock")
        self.frontend = self.ctx.socket(zmq.PULL)
        self.frontend.setsockopt(zmq.LINGER, 0)
        fid = protocol.reply_endpoint(f"ipc://{run_dir}/frontend.sock", 1, "test")
        assert fid is not None
        self.fid = fid.encode()
        self.frontend.bind(fid)

    def ready(self) -> bytes:
        assert self.controller.poll(60_000), "the worker never said it was ready"
        identity, kind, *_ = self.controller.recv_multipart()
        assert kind == protocol.READY
        return identity

    def close(self, worker: subprocess.Popen) -> None:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        self.frontend.close()
        self.controller.close()
        self.ctx.term()


def test_a_continuous_worker_streams_to_the_frontend_and_tells_the_controller_begin_and_end(
        tmp_path: Path) -> None:
    sockets = Sockets(tmp_path)
    worker = start_continuous_worker(tmp_path, direct=True)
    try:
        identity = sockets.ready()
        sent_at = time.monotonic()
        sockets.controller.send_multipart([identity, *generation(b"s1", sockets.fid, 4)])

        at_frontend = received(sockets.frontend, protocol.REPLY, b"s1")
        assert [m[0] for m in at_frontend] == [protocol.CHUNK] * 3 + [protocol.REPLY]
        results = [protocol.parse_results(m[1:]) for m in at_frontend]
        assert [[(r.rid, r.body.split(b":")[1]) for r in rs] for rs in results] == [
            [(b"s1", b"1 ")], [(b"s1", b"2 ")], [(b"s1", b"3 ")], [(b"s1", b"4 ")]]

        at_controller = received(sockets.controller, protocol.ANSWERED, b"s1")
        kinds = [m[0] for m in at_controller]
        assert kinds[0] == protocol.STEPPED and kinds[-1] == protocol.ANSWERED
        assert set(kinds[1:-1]) <= {protocol.STEPPED}  # no part passes the controller
        firsts, gaps = protocol.parse_stepped(at_controller[0][1:])
        [(rid, began)] = firsts
        assert rid == b"s1" and sent_at < began < time.monotonic()
        later = [protocol.parse_stepped(m[1:]) for m in at_controller[1:-1]]
        assert all(not f for f, _ in later)
        reported = gaps + [g for _, gs in later for g in gs]
        assert len(reported) == 2  # one a part after the first, all told by the end
        assert all(0.1 < g < 5.0 for g in reported)  # steps of 0.2 s apart
        [(answered, head)] = [(r.rid, r.head) for r in
                              protocol.parse_answered(at_controller[-1][1:])]
        assert answered == b"s1" and protocol.Head.parse(head).status == 200

        # a frontend the controller knows by a name only: the stream passes the controller
        sockets.controller.send_multipart([identity, *generation(b"s2", b"frontend-1", 2)])
        routed = received(sockets.controller, protocol.DONE, b"s2")
        assert [m[0] for m in routed if m[0] != protocol.STEPPED] == [protocol.CHUNK,
                                                                        protocol.DONE]
        assert not sockets.frontend.poll(300)
    finally:
        sockets.close(worker)


def test_a_stateful_models_worker_streams_through_the_controller(tmp_path: Path) -> None:
    """``direct_streams`` off (a model with sequence batching: its parts' heads may end the
    sequences the controller keeps): every part and answer passes the controller."""
    sockets = Sockets(tmp_path)
    worker = start_continuous_worker(tmp_path, direct=False)
    try:
        identity = sockets.ready()
        sockets.controller.send_multipart([identity, *generation(b"s1", sockets.fid, 3)])
        routed = received(sockets.controller, protocol.DONE, b"s1")
        assert [m[0] for m in routed if m[0] != protocol.STEPPED] == [protocol.CHUNK] * 2 + [
            protocol.DONE]
        assert not sockets.frontend.poll(300)
    finally:
        sockets.close(worker)
