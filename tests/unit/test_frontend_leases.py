"""A frontend's side of a lease, against real sockets standing in for the controller's frontend
socket (a ZeroMQ ROUTER) and a lent worker's job socket (a Unix SOCK_SEQPACKET listener)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time

import zmq
from test_async_bridge import controller_socket, request

from mservd import protocol
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.leases import HeldLeases
from mservd.worker.frontend_links import FrontendLinks


async def received(sock: zmq.Socket, within: float = 5.0) -> list[bytes]:
    for _ in range(int(within / 0.002)):
        if sock.poll(0):
            return sock.recv_multipart()
        await asyncio.sleep(0.002)
    raise AssertionError("nothing came")


class Jobs:
    """A lent worker's job socket, as ``mservd.worker.job_socket.JobSocket`` binds it: each message one
    leased BATCH, answered on the same connection."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(endpoint[len("ipc://"):])
        self.listener.listen(8)
        self.listener.setblocking(False)
        self.conn: socket.socket | None = None

    def poll(self) -> list[bytes] | None:
        """The next BATCH's frames, if one came."""
        if self.conn is None:
            with contextlib.suppress(BlockingIOError):
                self.conn, _ = self.listener.accept()
                self.conn.setblocking(False)
        if self.conn is not None:
            with contextlib.suppress(BlockingIOError):
                return protocol.parse_job_message(self.conn.recv(protocol.JOB_MESSAGE_MAX))
        return None

    async def received(self, within: float = 5.0) -> list[bytes]:
        for _ in range(int(within / 0.002)):
            frames = self.poll()
            if frames is not None:
                return frames
            await asyncio.sleep(0.002)
        raise AssertionError("nothing came")

    def received_now(self) -> list[bytes]:
        for _ in range(2500):
            frames = self.poll()
            if frames is not None:
                return frames
            time.sleep(0.002)
        raise AssertionError("nothing came")

    def answer(self, results: list[protocol.Result]) -> None:
        assert self.conn is not None
        self.conn.send(protocol.job_message(protocol.replies(results)))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


class Stage:
    """The controller's socket, one worker's job socket, and the worker's line back."""

    def __init__(self, tmp_path, timeout: float = 60.0) -> None:
        self.ctx = zmq.Context()
        self.endpoint = f"ipc://{tmp_path}/frontend.sock"
        self.router = controller_socket(self.ctx, self.endpoint)
        self.jobs_endpoint = f"ipc://{tmp_path}/jobs-1.sock"
        self.jobs = Jobs(self.jobs_endpoint)
        self.links = FrontendLinks(self.ctx, f"ipc://{tmp_path}/backend.sock")
        self.lease = protocol.Lease("m", "1.0", True, self.jobs_endpoint, 4, timeout)

    async def lend_after_first(self, bridge: AsyncBridge) -> bytes:
        """Answer one request as the controller, then lend the worker: the frontend's name."""
        reply = asyncio.ensure_future(bridge.call(b"r0", request(b"r0"), 5.0))
        fid, *_ = await received(self.router)
        self.router.send_multipart([fid, *protocol.replies(
            [protocol.Result(b"r0", protocol.head(200), b"via the controller")])])
        assert (await reply).body == b"via the controller"
        self.router.send_multipart([fid, *protocol.lease(self.lease)])
        for _ in range(1000):  # the LEASE lands and the frontend connects to the worker
            if bridge._leases:
                break
            await asyncio.sleep(0.005)
        return fid

    def close(self) -> None:
        self.links.close()
        self.jobs.close()
        self.router.close(linger=0)
        self.ctx.term()


def play(tmp_path, scene, timeout: float = 60.0) -> None:
    """Run ``scene(stage, bridge)`` with a frontend's bridge on the stage, then clear it."""
    stage = Stage(tmp_path, timeout)

    async def main() -> None:
        bridge = AsyncBridge(stage.endpoint)
        try:
            await scene(stage, bridge)
        finally:
            bridge.close()

    try:
        asyncio.run(main())
    finally:
        stage.close()


def test_a_lent_worker_gets_the_frontends_requests_and_answers_them_itself(tmp_path) -> None:
    async def scene(stage: Stage, bridge: AsyncBridge) -> None:
        fid = await stage.lend_after_first(bridge)
        call = asyncio.ensure_future(bridge.call(b"r1", request(b"r1"), 5.0))
        frames = await stage.jobs.received()
        assert frames[0] == protocol.BATCH
        [job] = protocol.parse_batch(frames[1:])
        assert (job.rid, job.fid, job.payloads) == (b"r1", fid, [b"payload of r1"])
        stage.jobs.answer([protocol.Result(b"r1", protocol.head(200), b"on the link")])
        assert (await call).body == b"on the link"
        # an answer too big for the link (or streamed) comes on the reply socket instead
        call = asyncio.ensure_future(bridge.call(b"r2", request(b"r2"), 5.0))
        [job] = protocol.parse_batch((await stage.jobs.received())[1:])
        answer = protocol.Result(b"r2", protocol.head(200), b"from the worker")
        assert stage.links.deliver([job], [answer], wait=1.0)
        assert (await call).body == b"from the worker"
        assert not stage.router.poll(50)  # the controller saw none of it

    play(tmp_path, scene)


def test_requests_on_a_lost_workers_lease_go_through_the_controller_again(tmp_path) -> None:
    async def scene(stage: Stage, bridge: AsyncBridge) -> None:
        fid = await stage.lend_after_first(bridge)
        call = asyncio.ensure_future(bridge.call(b"r1", request(b"r1"), 5.0))
        await stage.jobs.received()  # the worker took it, and dies
        stage.router.send_multipart([fid, *protocol.revoke(stage.jobs_endpoint, True)])
        _, *frames = await received(stage.router)
        [(route, _)] = protocol.parse_predictions(frames[1:])
        assert route.rid == b"r1"
        stage.router.send_multipart([fid, *protocol.replies(
            [protocol.Result(b"r1", protocol.head(200), b"second try")])])
        assert (await call).body == b"second try"
        later = asyncio.ensure_future(bridge.call(b"r2", request(b"r2"), 5.0))
        _, *frames = await received(stage.router)  # no lease any more
        stage.router.send_multipart([fid, *protocol.replies(
            [protocol.Result(b"r2", protocol.head(200), b"ok")])])
        await later

    play(tmp_path, scene)


def test_a_leased_batch_that_hangs_is_answered_worker_died_and_reported(tmp_path) -> None:
    async def scene(stage: Stage, bridge: AsyncBridge) -> None:
        await stage.lend_after_first(bridge)
        call = asyncio.ensure_future(bridge.call(b"r1", request(b"r1"), 10.0))
        await stage.jobs.received()  # ... and never answered
        _, *frames = await received(stage.router, within=3.0)
        assert frames == protocol.overdue(stage.jobs_endpoint)
        reply = await call
        assert reply.status == 500
        assert json.loads(reply.body)["message"] == "Worker died."

    play(tmp_path, scene, timeout=0.05)


def test_held_leases_send_a_batch_per_lease_and_the_rest_to_the_controller(tmp_path) -> None:
    loop = asyncio.new_event_loop()
    jobs = Jobs(f"ipc://{tmp_path}/jobs-1.sock")
    held = HeldLeases(b"ipc://me", loop, [].append)
    try:
        held.grant(protocol.Lease("m", "1.0", True, jobs.endpoint, 2, 60.0))
        explain = protocol.prediction(b"x", "m", None, None, protocol.CODEC_TORCHSERVE, [], {},
                                      [], explain=True)
        other = protocol.prediction(b"o", "other", None, None, protocol.CODEC_TORCHSERVE, [], {},
                                    [])
        workflow = protocol.prediction(b"w", "m", None, None, protocol.CODEC_TORCHSERVE, [], {},
                                       [], workflow=True)  # a workflow named as the model
        r = {rid: request(rid) for rid in (b"r1", b"r2", b"r3", b"r4", b"r5", b"r6")}
        rest = held.send([r[b"r1"], explain, workflow, r[b"r2"], other, r[b"r3"]])
        # a batch of two (the lease's); no explain, no workflow
        assert rest == [explain, workflow, other, r[b"r3"]]
        batch = protocol.parse_batch(jobs.received_now()[1:])
        assert [(q.rid, q.fid) for q in batch] == [(b"r1", b"ipc://me"), (b"r2", b"ipc://me")]
        assert held.send([r[b"r4"]]) == [r[b"r4"]]  # one batch in flight
        held.answered(b"r1")
        assert held.send([r[b"r4"]]) == [r[b"r4"]]  # ... until all of it is answered
        held.answered(b"r2")
        assert held.send([r[b"r5"]]) == []
        assert held.end(jobs.endpoint, lost=True) == [r[b"r5"]]
        assert not held and held.send([r[b"r6"]]) == [r[b"r6"]]
    finally:
        held.close()
        jobs.close()
        loop.close()


def test_a_lease_granted_again_sends_at_once_on_the_link_it_kept(tmp_path) -> None:
    """A worker recalled and lent again is still connected: the first request after the new
    LEASE goes to it, not to the controller (which would recall it once more)."""
    loop = asyncio.new_event_loop()
    endpoint = f"ipc://{tmp_path}/jobs-1.sock"
    jobs = Jobs(endpoint)
    held = HeldLeases(b"ipc://me", loop, [].append)
    lease = protocol.Lease("m", "1.0", True, endpoint, 1, 60.0)
    try:
        held.grant(lease)
        assert held.send([request(b"r1")]) == []
        held.answered(b"r1")
        held.end(endpoint)  # REVOKE, the worker lives on
        r2 = request(b"r2")
        assert held.send([r2]) == [r2]
        held.grant(lease)
        assert held.send([request(b"r3")]) == []  # no wait for a new connection
        sent = [protocol.parse_batch(jobs.received_now()[1:])[0].rid for _ in range(2)]
        assert sent == [b"r1", b"r3"]
        held.end(endpoint, lost=True)
        assert held.links == {}
    finally:
        held.close()
        jobs.close()
        loop.close()


def test_under_token_authorization_only_a_live_inference_key_goes_to_the_lent_worker(
        tmp_path) -> None:
    """The lease carries the key's SHA-256 digest and expiry: a wrong, missing or expired
    token goes to the controller (which answers 401), never to the worker."""
    import hashlib

    def with_token(rid: bytes, token: str | None) -> list[bytes]:
        return protocol.prediction(rid, "m", None, token, protocol.CODEC_TORCHSERVE,
                                   [("body", "text/plain")], {}, [b"payload"])

    loop = asyncio.new_event_loop()
    endpoint = f"ipc://{tmp_path}/jobs-1.sock"
    jobs = Jobs(endpoint)
    held = HeldLeases(b"ipc://me", loop, [].append)
    digest = hashlib.sha256(b"the-key").digest()
    try:
        held.grant(protocol.Lease("m", "1.0", True, endpoint, 1, 60.0, digest,
                                  time.time() + 60))
        refused = [with_token(b"no", None), with_token(b"wrong", "not-the-key")]
        assert held.send(refused) == refused
        assert held.send([with_token(b"good", "the-key")]) == []
        assert protocol.parse_batch(jobs.received_now()[1:])[0].rid == b"good"
        held.answered(b"good")
        held.grant(protocol.Lease("m", "1.0", True, endpoint, 1, 60.0, digest,
                                  time.time() - 1))  # the key has expired
        late = with_token(b"late", "the-key")
        assert held.send([late]) == [late]
    finally:
        held.close()
        jobs.close()
        loop.close()


def test_a_lost_lease_answers_its_streamed_requests_and_sends_the_silent_ones_again(
        tmp_path) -> None:
    """A request that had streamed a part to its client was sent to the controller again when
    its lent worker died, and run from its start elsewhere: its client got its parts twice."""
    loop = asyncio.new_event_loop()
    jobs = Jobs(f"ipc://{tmp_path}/jobs-1.sock")
    delivered: list[list[bytes]] = []
    held = HeldLeases(b"ipc://me", loop, delivered.append)
    try:
        held.grant(protocol.Lease("m", "1.0", True, jobs.endpoint, 2, 60.0))
        r1, r2 = request(b"r1"), request(b"r2")
        assert held.send([r1, r2]) == []
        held.part_sent(b"r1")
        assert held.end(jobs.endpoint, lost=True) == [r2]  # only the silent one moves
        [(kind, rid, head, body)] = delivered
        assert (kind, rid) == (protocol.REPLY, b"r1")
        assert protocol.Head.parse(head).status == 500
        assert b"Worker died after this request had streamed part of its answer" in body
    finally:
        held.close()
        jobs.close()
        loop.close()
