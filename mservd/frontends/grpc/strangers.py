"""Calls whose token the controller refuses: refused before their message is read.

grpc reads a call's whole message (up to ``max_request_size``) before any servicer runs, so
a token checked by the servicer, or by the controller behind it, is checked after the
message has been received, decoded and forwarded: a stranger's 300 calls of 6 MB at once
took the gRPC frontend from 51 MiB to 5.2 GiB and kept it busy 38 s. :class:`RefuseStrangers`
asks the controller about a guarded method's token when the call arrives (its metadata come
first), as the HTTP frontends ask before a body; a refused call gets a handler that never
reads its message (``AsyncBridge.refusal``: tokens accepted lately are taken without asking,
and the servicers keep a key holder's fresh with each answer, as the HTTP frontends do). The
controller still checks each call itself. A call with two ``authorization`` entries, on any
method, is refused UNAUTHENTICATED: :func:`call_token` is the one reading of a call's key; so
is a dashboard session offered as the management key (it opens the dashboard alone).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import grpc

from mservd import protocol
from mservd.auth import SESSION_PREFIX
from mservd.errors import error_message
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.bridge import ControllerGone, bearer_token
from mservd.frontends.grpc.errors import status_code
from mservd.frontends.spaced import TooManyQuestions


class TwoTokens(ValueError):
    """A call with more than one ``authorization`` metadata entry: which one counts would
    depend on who reads it, so none does."""


def call_token(metadata: Any) -> str | None:
    """The key of a call's one ``authorization: Bearer <key>`` metadata entry (None: none).

    :raises TwoTokens: the call has more than one such entry.
    """
    entries = [value for key, value in metadata or () if key.lower() == "authorization"]
    if len(entries) > 1:
        raise TwoTokens(f"The call has {len(entries)} 'authorization' metadata entries; send "
                        "exactly one: authorization: Bearer <key>.")
    return bearer_token(str(entries[0])) if entries else None


class RefuseStrangers(grpc.aio.ServerInterceptor):
    """Guards ``methods`` (full names; None: every method) of one server: its token is
    asked about for ``api`` (``protocol.API_INFERENCE`` or ``API_MANAGEMENT``)."""

    def __init__(self, bridge: AsyncBridge, api: str,
                 methods: Collection[str] | None = None) -> None:
        self.bridge = bridge
        self.api = api
        self.methods = None if methods is None else frozenset(methods)

    async def intercept_service(self, continuation: Callable,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        try:
            token = call_token(details.invocation_metadata)
        except TwoTokens as exc:  # any method: the guard and the servicer read one entry
            return _refusal(await continuation(details), grpc.StatusCode.UNAUTHENTICATED,
                            str(exc))
        if self.api == protocol.API_MANAGEMENT and token and token.startswith(SESSION_PREFIX):
            return _refusal(await continuation(details), grpc.StatusCode.UNAUTHENTICATED,
                            "Token authorization failed: a dashboard session opens the "
                            "dashboard alone; send the management key.")
        if self.methods is not None and details.method not in self.methods:
            return await continuation(details)
        try:
            refused = await self.bridge.refusal(token, self.api)
        except (ControllerGone, TooManyQuestions) as exc:
            return _refusal(await continuation(details), grpc.StatusCode.UNAVAILABLE,
                            str(exc))
        if refused is not None:
            return _refusal(await continuation(details), status_code(refused.status),
                            error_message(refused.body))
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
