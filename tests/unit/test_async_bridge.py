"""The frontends' line to the controller, against a real ZeroMQ ROUTER standing in for the
controller's socket: what one turn of the event loop sends, and how grouped answers come back."""

from __future__ import annotations

import asyncio

import zmq

from mservd import protocol
from mservd.frontends.async_bridge import AsyncBridge
from mservd.worker.frontend_links import FrontendLinks


def request(rid: bytes) -> list[bytes]:
    return protocol.prediction(rid, "m", None, None, protocol.CODEC_TORCHSERVE,
                               [("body", "text/plain")], {}, [b"payload of " + rid])


def controller_socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A ROUTER bound where the controller's frontend socket would be."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    return router


def test_bridge_sends_one_loop_turns_requests_as_one_message_and_takes_grouped_answers(
        tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/controller.sock"
    ctx = zmq.Context()
    router = controller_socket(ctx, endpoint)
    received: list[list[bytes]] = []

    async def controller() -> None:
        """Answer the first message's requests in one REPLY, the last part of a CHUNK first."""
        while not router.poll(0):
            await asyncio.sleep(0.001)
        fid, *frames = router.recv_multipart()
        received.append(frames)
        rids = [route.rid for route, _ in protocol.parse_predictions(frames[1:])]
        router.send_multipart([fid, *protocol.chunks(
            [protocol.Result(rids[0], protocol.head(200), b"part")])])
        router.send_multipart([fid, *protocol.replies(
            protocol.Result(rid, protocol.head(200, "text/plain"), b"answer to " + rid)
            for rid in rids)])

    async def main() -> list[protocol.Reply]:
        bridge = AsyncBridge(endpoint)
        try:
            answering = asyncio.ensure_future(controller())
            calls = [bridge.call(rid, request(rid), 3.0) for rid in (b"r1", b"r2", b"r3")]
            replies = await asyncio.gather(*calls)  # all sent in the same turn of the loop
            await answering
            return replies
        finally:
            bridge.close()

    try:
        replies = asyncio.run(main())
    finally:
        router.close()
        ctx.term()
    [message] = received  # three requests, one message
    assert message[0] == protocol.PREDICT
    assert [(route.rid, parts[1:]) for route, parts in protocol.parse_predictions(message[1:])] \
        == [(b"r1", [b"payload of r1"]), (b"r2", [b"payload of r2"]), (b"r3", [b"payload of r3"])]
    assert [(r.status, r.body) for r in replies] == [
        (200, b"answer to r1"), (200, b"answer to r2"), (200, b"answer to r3")]


def test_a_worker_answers_the_frontend_on_its_reply_socket_and_the_controller_forwards_nothing(
        tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/frontend.sock"
    ctx = zmq.Context()
    router = controller_socket(ctx, endpoint)
    links = FrontendLinks(ctx, f"ipc://{tmp_path}/backend.sock")  # a worker's, same run folder
    fids: list[bytes] = []

    async def controller_and_worker() -> None:
        """Take the request as the controller does, then answer it as a worker: straight to
        the frontend the controller knows it by (the first try may find it still connecting)."""
        while not router.poll(0):
            await asyncio.sleep(0.001)
        fid, *frames = router.recv_multipart()
        fids.append(fid)
        [(route, _)] = protocol.parse_predictions(frames[1:])
        job = protocol.Request(route.rid, protocol.CODEC_TORCHSERVE, [], {}, [], fid=fid)
        answer = protocol.Result(route.rid, protocol.head(200, "text/plain"), b"direct")
        for _ in range(6000):  # 30 s: a slow minute takes long, a broken link forever
            if links.deliver([job], [answer]):
                return
            await asyncio.sleep(0.005)
        raise AssertionError("the worker never reached the frontend's reply socket")

    async def main() -> protocol.Reply:
        bridge = AsyncBridge(endpoint)
        try:
            answering = asyncio.ensure_future(controller_and_worker())
            reply = await bridge.call(b"r1", request(b"r1"), 30.0)
            await answering
            return reply
        finally:
            bridge.close()

    try:
        reply = asyncio.run(main())
        assert not router.poll(50)  # nothing more came for the controller to answer
    finally:
        links.close()
        router.close()
        ctx.term()
    assert (reply.status, reply.content_type, reply.body) == (200, "text/plain", b"direct")
    [fid] = fids
    assert fid.startswith(f"ipc://{tmp_path}/reply-".encode())
    assert not list(tmp_path.glob("reply-*"))  # the frontend's reply socket went with it


def test_a_worker_sends_no_answer_directly_that_must_pass_the_controller(tmp_path) -> None:
    ctx = zmq.Context()
    links = FrontendLinks(ctx, f"ipc://{tmp_path}/backend.sock")
    answer = protocol.Result(b"r", protocol.head(200), b"{}")

    def job(fid: bytes) -> protocol.Request:
        return protocol.Request(b"r", protocol.CODEC_TORCHSERVE, [], {}, [], fid=fid)

    try:
        # a frontend outside this daemon's run folder, or one known by a name only
        assert not links.deliver([job(b"ipc:///elsewhere/reply-1-x.sock")], [answer])
        assert not links.deliver([job(b"\x00k\x8b\x45g")], [answer])
        assert not links.links  # no socket was even opened for them
        # a streamed answer: its parts went through the controller, its end must follow them
        fid = f"ipc://{tmp_path}/reply-1-x.sock".encode()
        assert not links.deliver([job(fid)], [answer], streamed={b"r"})
        assert not links.links
        # a frontend that is not (or no longer) there
        assert not links.deliver([job(fid)], [answer])
    finally:
        links.close()
        ctx.term()


def test_a_stream_left_unread_is_cancelled_and_one_that_fails_late_says_so(tmp_path) -> None:
    """A caller that stops reading a streamed answer (a gRPC client that cancelled) sends the
    controller a CANCEL, so a continuous worker frees the slot; a stream whose final answer
    failed after parts went out tells its status (``Reply.final_status``)."""
    endpoint = f"ipc://{tmp_path}/controller.sock"
    ctx = zmq.Context()
    router = controller_socket(ctx, endpoint)
    received: list[bytes] = []

    async def controller() -> None:
        """Answer r1 with a part, then a 504; r2 with a part, then wait for its CANCEL."""
        answered = 0
        while answered < 2 or protocol.CANCEL not in received:
            if not router.poll(0):
                await asyncio.sleep(0.001)
                continue
            fid, *frames = router.recv_multipart()
            received.append(frames[0])
            if frames[0] != protocol.PREDICT:
                continue
            for route, _ in protocol.parse_predictions(frames[1:]):
                answered += 1
                router.send_multipart([fid, *protocol.chunks(
                    [protocol.Result(route.rid, protocol.head(200), b"part")])])
                if route.rid == b"r1":
                    router.send_multipart([fid, *protocol.replies([protocol.Result(
                        route.rid, protocol.head(504), b'{"code": 504}')])])

    async def main() -> tuple[list[bytes], int | None]:
        bridge = AsyncBridge(endpoint)
        try:
            answering = asyncio.ensure_future(controller())
            failing = await bridge.call(b"r1", request(b"r1"), 3.0, stream=True)
            bodies = [failing.body] + [body async for body in failing.stream]
            unread = await bridge.call(b"r2", request(b"r2"), 3.0, stream=True)
            unread.give_up()  # the client went away after the first part
            await asyncio.wait_for(answering, 3.0)
            return bodies, failing.final_status
        finally:
            bridge.close()

    try:
        bodies, final_status = asyncio.run(main())
    finally:
        router.close()
        ctx.term()
    assert bodies == [b"part", b'{"code": 504}'] and final_status == 504
    assert received.count(protocol.CANCEL) == 1


def test_a_call_past_its_reply_timeout_cancels_its_request(tmp_path) -> None:
    """A frontend that stopped waiting left the request running: a non-streamed generation
    went on to its end on a worker with no one to answer."""
    import pytest

    from mservd.frontends.bridge import ControllerGone

    endpoint = f"ipc://{tmp_path}/controller.sock"
    ctx = zmq.Context()
    router = controller_socket(ctx, endpoint)

    async def main() -> list[bytes]:
        bridge = AsyncBridge(endpoint)
        try:
            with pytest.raises(ControllerGone, match="No answer from the controller within"):
                await bridge.call(b"r1", request(b"r1"), 0.2)
            for _ in range(3000):  # the PREDICT, then (when the call gives up) its CANCEL
                if router.poll(0):
                    _, *frames = router.recv_multipart()
                    if frames[0] == protocol.CANCEL:
                        return frames
                await asyncio.sleep(0.001)
            return []
        finally:
            bridge.close()

    try:
        frames = asyncio.run(main())
    finally:
        router.close()
        ctx.term()
    assert frames == protocol.cancel(b"r1")
