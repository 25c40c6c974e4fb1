"""Calls whose message is no protobuf of its type: refused INVALID_ARGUMENT, logged in one line.

grpc decodes a call's message before any servicer runs; when that fails it answers UNKNOWN
("Exception deserializing request!") and logs an ERROR with a traceback, before any token is
checked, so a stranger could fill grpc.log. :class:`RefuseUndecodable` gives each method a
decoder that returns a mark instead of raising, and refuses a marked call before its servicer
runs: the client learns what was wrong with its call, and the log gets one WARNING line.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from mservd.frontends.log_throttle import throttled

log = throttled("mservd.frontends.grpc")  # a stranger's calls: lines capped per message


class Undecodable:
    """What the tolerant decoder returns for a message it could not read."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def read(raw: bytes) -> Any:
        try:
            return decode(raw)
        except DecodeError as exc:
            return Undecodable(exc)
    return read


async def _refuse(method: str, mark: Undecodable, context: grpc.aio.ServicerContext) -> None:
    log.warning("refused a %s call that is no protobuf message: %s", method, mark.error)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"The request is no protobuf message of {method}'s type: {mark.error}")


def _forget_frames(exc: BaseException) -> None:
    """An aborted call's ``AbortError`` outlives it in a reference cycle (its traceback's
    frames hold the call's context, whose state holds the error) until a full collection,
    and with it every local of those frames: a 6 MB message, and what the servicer made of
    it, per aborted call. Their locals are dropped instead, and those of the errors it was
    raised while handling."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def _unary_unary(method: str, behavior: Callable) -> Callable:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await _refuse(method, request, context)
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError as exc:
            del request  # this frame is in the traceback too, and still running
            _forget_frames(exc)
            raise
    return call


def _unary_stream(method: str, behavior: Callable) -> Callable:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await _refuse(method, request, context)
        try:
            async for answer in behavior(request, context):
                yield answer
        except grpc.aio.AbortError as exc:
            del request  # this frame is in the traceback too, and still running
            _forget_frames(exc)
            raise
    return call


def _stream_stream(method: str, behavior: Callable) -> Callable:
    """A stream of requests (StreamPredictions2): one that is no protobuf ends the call."""
    async def call(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async def checked() -> Any:
            async for request in requests:
                if isinstance(request, Undecodable):
                    await _refuse(method, request, context)
                yield request
        async for answer in behavior(checked(), context):
            yield answer
    return call


class RefuseUndecodable(grpc.aio.ServerInterceptor):
    """Every method of the servers' services, wrapped once and kept: those whose requests
    come one per call, and the one whose requests and answers stream both ways."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(self, continuation: Callable,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        if method in self.handlers:
            return self.handlers[method]
        handler = await continuation(details)
        if handler is not None and handler.request_deserializer is not None:
            decode = _tolerant(handler.request_deserializer)
            if handler.request_streaming and handler.response_streaming:
                handler = handler._replace(request_deserializer=decode,
                                           stream_stream=_stream_stream(method,
                                                                        handler.stream_stream))
            elif handler.response_streaming and not handler.request_streaming:
                handler = handler._replace(request_deserializer=decode,
                                           unary_stream=_unary_stream(method,
                                                                      handler.unary_stream))
            elif not handler.request_streaming:
                handler = handler._replace(request_deserializer=decode,
                                           unary_unary=_unary_unary(method,
                                                                    handler.unary_unary))
        if handler is not None:  # an unknown method's name is the client's: not kept
            self.handlers[method] = handler
        return handler
