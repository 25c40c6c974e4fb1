"""A worker that answers its frontends itself tells the controller first: the client it answers
may send its next request at once, and the controller must already know the worker is free."""

from __future__ import annotations

import zmq

from handlers.context import Context
from mservd import protocol
from mservd.worker.batches import Batches
from mservd.worker.cores import Threads
from mservd.worker.frontend_links import FrontendLinks


class Echo:
    def handle(self, data, context):
        return [row.get("body") for row in data]


class Recorded:
    """A worker's socket to the controller that notes each message's kind as it goes."""

    def __init__(self, sock: zmq.Socket, sent: list[str]) -> None:
        self.sock, self.sent = sock, sent

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append("controller " + frames[0].decode())
        self.sock.send_multipart(frames)


class RecordedLinks(FrontendLinks):
    def __init__(self, zctx: zmq.Context, backend: str, sent: list[str]) -> None:
        super().__init__(zctx, backend)
        self.sent = sent

    def send(self, fid: bytes, frames: list[bytes], wait: float = 0.0) -> bool:
        self.sent.append("frontend " + frames[0].decode())
        return super().send(fid, frames, wait)


def one_batch(fid: bytes) -> list[bytes]:
    return protocol.batch_of([protocol.Request(
        b"r1", protocol.CODEC_TORCHSERVE, [("body", "text/plain")], {}, [b"hello"], fid=fid)])


def worker(tmp_path, zctx: zmq.Context, sent: list[str]):
    """A worker's batch runner on real sockets: a DEALER to a ROUTER where the controller's
    worker socket would be, and its links to frontends in the same run folder."""
    controller = zctx.socket(zmq.ROUTER)
    controller.setsockopt(zmq.LINGER, 0)
    controller.bind(f"ipc://{tmp_path}/backend.sock")
    to_controller = zctx.socket(zmq.DEALER)
    to_controller.setsockopt(zmq.LINGER, 0)
    to_controller.connect(f"ipc://{tmp_path}/backend.sock")
    links = RecordedLinks(zctx, f"ipc://{tmp_path}/backend.sock", sent)
    context = Context("m", ".", {"model": {"modelVersion": "1.0"}}, 8, None, "mservd")
    batches = Batches(Recorded(to_controller, sent), Echo(), context, links, 1 << 20,
                      Threads(None))
    return controller, to_controller, links, batches


def test_a_worker_tells_the_controller_answered_before_it_sends_the_frontend_its_answers(
        tmp_path) -> None:
    zctx = zmq.Context()
    fid = f"ipc://{tmp_path}/reply-1-x.sock".encode()
    frontend = zctx.socket(zmq.PULL)
    frontend.setsockopt(zmq.LINGER, 0)
    frontend.bind(fid.decode())
    sent: list[str] = []
    controller, to_controller, links, batches = worker(tmp_path, zctx, sent)
    try:
        link = links._link(fid)
        # ZeroMQ connects in the background
        assert link.poll(30_000, zmq.POLLOUT), "the link to the frontend never connected"
        batches.from_controller(one_batch(fid))
        assert sent == ["controller " + protocol.ANSWERED.decode(),
                        "frontend " + protocol.REPLY.decode()]
        assert controller.poll(2000)
        _, kind, *heads = controller.recv_multipart()
        assert kind == protocol.ANSWERED
        assert [r.rid for r in protocol.parse_answered(heads)] == [b"r1"]
        assert frontend.poll(2000)
        kind, *replies = frontend.recv_multipart()
        assert kind == protocol.REPLY
        assert [(r.rid, r.body) for r in protocol.parse_results(replies)] == [(b"r1", b"hello")]
    finally:
        for sock in (frontend, controller, to_controller):
            sock.close(linger=0)
        links.close()
        zctx.term()


def test_a_worker_that_cannot_reach_a_frontend_now_sends_the_whole_answer_to_the_controller(
        tmp_path) -> None:
    zctx = zmq.Context()
    fid = f"ipc://{tmp_path}/reply-1-gone.sock".encode()  # nobody binds it
    sent: list[str] = []
    controller, to_controller, links, batches = worker(tmp_path, zctx, sent)
    try:
        batches.from_controller(one_batch(fid))
        assert sent == ["controller " + protocol.DONE.decode()]  # no ANSWERED, nothing direct
        assert controller.poll(2000)
        _, kind, *results = controller.recv_multipart()
        assert kind == protocol.DONE
        assert [(r.rid, r.body) for r in protocol.parse_results(results)] == [(b"r1", b"hello")]
    finally:
        for sock in (controller, to_controller):
            sock.close(linger=0)
        links.close()
        zctx.term()
