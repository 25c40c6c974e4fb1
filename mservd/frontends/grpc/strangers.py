"""Calls whose token the controller refuses: refused before their message is read.

grpc reads a call's whole message (up to ``max_request_size``) before any servicer runs, so
a token checked by the servicer, or by the controller behind it, is checked after the
message has been received, decoded and forwarded: a stranger's 300 calls of 6 MB at once
took the gRPC frontend from 51 MiB to 5.2 GiB and kept it busy 38 s. :class:`RefuseStrangers`
asks the controller about a guarded method's token when the call arrives (its metadata come
first), as the HTTP frontends ask before a body; a refused call gets a handler that never
reads its message. Tokens accepted lately are taken without asking (``AcceptedTokens``, which
the prediction servicers refresh with each answer, as the HTTP gateway does), and the
controller still checks each call itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

import grpc

from mservd.errors import error_message
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.bridge import AcceptedTokens, ControllerGone, bearer_token
from mservd.frontends.grpc.errors import status_code
from mservd.frontends.spaced import TooManyQuestions

CONTROL_TIMEOUT = 10.0  # seconds for the controller's answer about a token


class RefuseStrangers(grpc.aio.ServerInterceptor):
    """Guards ``methods`` (full names; None: every method) of one server: its token is
    asked about for ``api`` (``protocol.API_INFERENCE`` or ``API_MANAGEMENT``)."""

    def __init__(self, bridge: AsyncBridge, api: str, accepted: AcceptedTokens,
                 methods: Collection[str] | None = None) -> None:
        self.bridge = bridge
        self.api = api
        self.methods = None if methods is None else frozenset(methods)
        self.accepted = accepted  # the servicers refresh it with each prediction answered

    async def intercept_service(self, continuation: Callable,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if self.methods is not None and details.method not in self.methods:
            return await continuation(details)
        token = None
        for key, value in details.invocation_metadata or ():
            if key.lower() == "authorization":
                token = bearer_token(str(value))
        now = time.monotonic()
        if self.accepted.knows(token, now):
            return await continuation(details)
        try:  # anyone may ask: spaced (AsyncBridge.ask_open)
            reply = await self.bridge.ask_open("authorize", {}, token, CONTROL_TIMEOUT,
                                               api=self.api)
        except (ControllerGone, TooManyQuestions) as exc:
            return _refusal(await continuation(details), grpc.StatusCode.UNAVAILABLE,
                            str(exc))
        if reply.status != 200:
            return _refusal(await continuation(details), status_code(reply.status),
                            error_message(reply.body))
        self.accepted.accepted(token, now)
        return await continuation(details)


def _refusal(handler: grpc.RpcMethodHandler | None, code: grpc.StatusCode,
             message: str) -> grpc.RpcMethodHandler | None:
    """A handler for ``handler``'s method that refuses the call without reading its message:
    it takes the requests as a stream and never iterates it."""
    if handler is None:  # an unknown method: grpc answers UNIMPLEMENTED
        return None

    async def refuse(requests, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    async def refuse_streaming(requests, context: grpc.aio.ServicerContext):
        await context.abort(code, message)
        yield  # never reached: it makes this the generator a streaming answer needs

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            refuse_streaming, response_serializer=handler.response_serializer)
    return grpc.stream_unary_rpc_method_handler(
        refuse, response_serializer=handler.response_serializer)
