"""A real worker process (``python -m mservd.worker``) answering on its own: the answers of a
batch go to the frontend's reply socket, and the controller hears only that they went.

The test's sockets stand where the controller's backend socket and a frontend's reply socket
would be, in one run folder, so that what crosses the process boundary is the worker's own."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import zmq
from conftest import spawn_worker

from mservd import protocol


def job(rid: bytes, fid: bytes) -> list[bytes]:
    request = protocol.Request(rid, protocol.CODEC_TORCHSERVE, [("body", "application/json")],
                               {}, [json.dumps({"n": rid.decode()}).encode()], fid=fid)
    return protocol.batch_of([request])


def test_a_worker_sends_its_answers_to_the_frontend_and_the_controller_only_their_heads(
        tmp_path: Path) -> None:
    ctx = zmq.Context()
    controller = ctx.socket(zmq.ROUTER)
    controller.setsockopt(zmq.LINGER, 0)
    controller.bind(f"ipc://{tmp_path}/backend.sock")
    frontend = ctx.socket(zmq.PULL)
    frontend.setsockopt(zmq.LINGER, 0)
    fid = protocol.reply_endpoint(f"ipc://{tmp_path}/frontend.sock", 1, "test")
    frontend.bind(fid)
    worker = spawn_worker(tmp_path, "echo_handler.py")
    try:
        assert controller.poll(60_000), "the worker never said it was ready"
        identity, kind, _ = controller.recv_multipart()
        assert kind == protocol.READY

        # a frontend known to the controller by a name only: the answer goes back through it
        controller.send_multipart([identity, *job(b"named", b"frontend-1")])
        assert controller.poll(10_000)
        _, kind, rid, head, body = controller.recv_multipart()
        assert (kind, rid) == (protocol.DONE, b"named")
        assert json.loads(body)["echo"] == {"n": "named"}

        # a frontend with a reply socket: once the worker has connected (in the background,
        # so the first batches may still come back through the controller), straight there
        kinds = []
        for i in range(1000):  # 10 s at least, a slow minute included
            rid = f"r{i}".encode()
            controller.send_multipart([identity, *job(rid, fid.encode())])
            assert controller.poll(10_000)
            _, kind, *frames = controller.recv_multipart()
            kinds.append(kind)
            if kind == protocol.ANSWERED:
                break
            time.sleep(0.01)
        assert kinds[-1] == protocol.ANSWERED, kinds
        assert set(kinds[:-1]) <= {protocol.DONE}
        [answered, answered_head] = frames  # its head alone, no body
        assert answered == rid and protocol.Head.parse(answered_head).status == 200
        assert frontend.poll(10_000)
        kind, got, head, body = frontend.recv_multipart()
        assert got == rid
        assert (kind, protocol.Head.parse(head).status) == (protocol.REPLY, 200)
        assert json.loads(body)["echo"] == {"n": rid.decode()}
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        frontend.close()
        controller.close()
        ctx.term()
