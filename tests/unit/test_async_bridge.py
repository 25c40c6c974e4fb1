"""The frontends' line to the controller, against a real ZeroMQ ROUTER standing in for the
controller's socket: what one turn of the event loop sends, and how grouped answers come back."""

from __future__ import annotations

import asyncio

import zmq

from mservd import protocol
from mservd.frontends.async_bridge import AsyncBridge


def request(rid: bytes) -> list[bytes]:
    return protocol.prediction(rid, "m", None, None, protocol.CODEC_TORCHSERVE,
                               [("body", "text/plain")], {}, [b"payload of " + rid])


def test_bridge_sends_one_loop_turns_requests_as_one_message_and_takes_grouped_answers(
        tmp_path) -> None:
    endpoint = f"ipc://{tmp_path}/controller.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
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
