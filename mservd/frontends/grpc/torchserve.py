"""TorchServe's gRPC services: ``InferenceAPIsService`` (Ping, Predictions, StreamPredictions,
StreamPredictions2) and ``ManagementAPIsService``, each call turned into the same controller
message as the REST route it mirrors. Answers are the REST answers' bodies; errors abort with
the mapped code, but on StreamPredictions2, where each is one request's answer's ``status``.

A request's ``sequence_id`` names its stateful model's sequence, as the
``ts_request_sequence_id`` header does over HTTP; the answer says the sequence it ran in.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypedDict
from urllib.parse import unquote

import grpc
from google.protobuf import empty_pb2

from mservd import protocol
from mservd.errors import BadRequest, error_message
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.bridge import ControllerGone, client_network, request_timeout_ms
from mservd.frontends.grpc.errors import status_code
from mservd.frontends.grpc.generated import (
    inference_pb2,
    inference_pb2_grpc,
    management_pb2,
    management_pb2_grpc,
)
from mservd.frontends.grpc.strangers import TwoTokens, call_token
from mservd.frontends.grpc.write_deadline import WriteDeadline
from mservd.frontends.spaced import TooManyQuestions
from mservd.protocol import Reply

log = logging.getLogger(__name__)

MANAGE_TIMEOUT = 600.0


def metadata_token(context: grpc.aio.ServicerContext, auth: bool) -> str | None:
    """The key of the ``authorization: Bearer <key>`` metadata entry, as over HTTP (None when
    the server checks no tokens). A call with two never gets here (strangers.RefuseStrangers);
    were one to, it would have no key."""
    if not auth:
        return None
    try:
        return call_token(context.invocation_metadata())
    except TwoTokens:
        return None


def forwarded_metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """Request metadata the handler sees as request headers (never the key)."""
    out = {}
    for key, value in context.invocation_metadata() or ():
        name = key.lower()
        if name != "authorization" and not name.startswith("grpc-") and isinstance(value, str):
            out[name] = value
    return out


def peer_client(context: grpc.aio.ServicerContext) -> str | None:
    """Who sent the call, as a stateful model's sequence counts its client: the peer's host
    (``ipv4:127.0.0.1:5432`` → ``127.0.0.1``, ``ipv6:[::1]:5432`` → ``::1``'s /64), as the
    HTTP routes name theirs, so a sequence opened over one goes on over the other."""
    peer = unquote(context.peer() or "")  # some grpc versions write [::1] as %5B::1%5D
    kind, _, address = peer.partition(":")
    if kind == "ipv4":
        return client_network(address.rpartition(":")[0])
    if kind == "ipv6":
        return client_network(address.rpartition(":")[0].strip("[]"))
    return client_network(peer or None)


async def deadline_ms(context: grpc.aio.ServicerContext) -> float | None:
    """Milliseconds the client gives its call (None: no limit): its gRPC deadline, or an
    ``x-request-timeout-ms`` metadata entry as over HTTP, whichever is less; an invalid entry
    aborts the call (INVALID_ARGUMENT)."""
    left = context.time_remaining()
    limit = None if left is None else max(0.0, left * 1000.0)
    for key, value in context.invocation_metadata() or ():
        if key.lower() == "x-request-timeout-ms":
            try:
                own = request_timeout_ms(str(value))
            except BadRequest as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
            limit = own if limit is None else min(limit, own)
    return limit


async def check(reply: Reply, context: grpc.aio.ServicerContext) -> Reply:
    """The reply when it succeeded; else the RPC aborts with the mapped code and message."""
    if reply.status >= 400:
        await context.abort(status_code(reply.status), error_message(reply.body))
    return reply


async def ask(context: grpc.aio.ServicerContext, call: Any) -> Reply:
    try:
        return await check(await call, context)
    except (ControllerGone, TooManyQuestions) as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        raise


async def remembering(bridge: AsyncBridge, api: str, token: str | None,
                      call: Awaitable[Reply]) -> Reply:
    """``call``'s reply; one the controller answered keeps its token remembered
    (``AsyncBridge.answered``), so a key holder that keeps calling is not asked about again
    (strangers.RefuseStrangers)."""
    reply = await call
    bridge.answered(token, api, reply.status)
    return reply


class Sequenced(TypedDict, total=False):
    """A response's ``sequence_id`` field, when its answer names one."""

    sequence_id: str


def sequence_of(reply: Reply) -> Sequenced:
    """The answer's sequence id, from its header (a stateful model's answers carry it)."""
    sequence = (reply.headers or {}).get(protocol.SEQUENCE_ID)
    return {"sequence_id": sequence} if sequence else {}


END = object()  # StreamPredictions2: a task that fed its responses is done
# StreamPredictions2: answers given to grpc but not yet written; past it no request is read
# (the client's own flow control then holds its requests) and no later part is taken
PENDING_ANSWERS = 8


def failed(status: int, body: bytes, sequence_id: str) -> inference_pb2.PredictionResponse:
    """StreamPredictions2's answer to a request that failed: its ``status``, the stream goes
    on."""
    return inference_pb2.PredictionResponse(
        sequence_id=sequence_id,
        status=inference_pb2.Status(code=status_code(status).value[0],
                                    message=error_message(body)))


async def _parts(reply: Reply, named: Sequenced, out: asyncio.Queue,
                 room: asyncio.Semaphore) -> None:
    """A streamed answer's later parts, each as a response of its own once there is
    ``room``; a final answer that failed (a deadline, a worker that died) as a failed
    request's."""
    try:
        async for body in reply.stream:
            await room.acquire()
            final_status = reply.final_status or 200
            if final_status >= 400:
                out.put_nowait(failed(final_status, body, named.get("sequence_id", "")))
            else:
                out.put_nowait(inference_pb2.PredictionResponse(prediction=body, **named))
    except Exception as exc:  # to the call, not lost in a task
        out.put_nowait(exc)
    finally:  # the call ended early (the client cancelled): the request is dropped
        reply.give_up()


class InferenceAPIs(inference_pb2_grpc.InferenceAPIsServiceServicer):
    def __init__(self, bridge: AsyncBridge, reply_timeout: float, auth: bool,
                 write_timeout: float, key_header: str = "x-traffic-key") -> None:
        self.bridge = bridge
        self.key_header = key_header  # the metadata whose value routes among versions
        self.reply_timeout = reply_timeout
        self.auth = auth
        self.write_timeout = write_timeout  # for each answer of a stream (write_deadline.py)

    async def Ping(self, request: empty_pb2.Empty,
                   context: grpc.aio.ServicerContext) -> inference_pb2.TorchServeHealthResponse:
        try:  # anyone may ask: spaced (AsyncBridge.ask_open)
            reply = await self.bridge.ask_open("ping", {}, None, 10.0)
        except (ControllerGone, TooManyQuestions) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return inference_pb2.TorchServeHealthResponse(health=reply.body.decode())

    async def Predictions(self, request: inference_pb2.PredictionsRequest,
                          context: grpc.aio.ServicerContext) -> inference_pb2.PredictionResponse:
        reply = await self._predict(request, context, stream=False)
        return inference_pb2.PredictionResponse(prediction=reply.body, **sequence_of(reply))

    async def StreamPredictions(
        self, request: inference_pb2.PredictionsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.PredictionResponse]:
        """One response per part a streaming handler sends, the final answer last (TorchServe's
        send_intermediate_predict_response); one response for any other handler."""
        reply = await self._predict(request, context, stream=True)
        deadline = WriteDeadline(context, "StreamPredictions", self.write_timeout,
                                 reply.give_up or (lambda: None))
        try:
            with deadline.writing():
                yield inference_pb2.PredictionResponse(prediction=reply.body,
                                                       **sequence_of(reply))
            if reply.stream is not None:
                async for body in reply.stream:
                    final_status = reply.final_status or 200
                    if final_status >= 400:  # it failed after it began
                        await context.abort(status_code(final_status), error_message(body))
                    with deadline.writing():
                        yield inference_pb2.PredictionResponse(prediction=body)
        finally:  # the client cancelled mid-stream: the request is dropped
            if reply.give_up is not None:
                reply.give_up()

    async def StreamPredictions2(
        self, requests: AsyncIterator[inference_pb2.PredictionsRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[inference_pb2.PredictionResponse]:
        """TorchServe's stream of a stateful model's sequence: each request is answered in
        turn, a failed one with the answer's ``status`` (the stream goes on), a streamed answer
        with one response per part. A request is sent once the one before it has begun to
        answer, so that with SequenceContinuousBatching it joins its sequence while that one
        still streams (a cancel, say). A request that names no sequence continues the one of
        the stream's first answer (the server opened it for the first request when that named
        none); one whose input ``ts_request_sequence_end`` is ``true`` ends it.

        A client that stops reading stops the stream: past ``PENDING_ANSWERS`` answers not yet
        written no request is read, and an answer not taken within the write deadline ends
        the call (write_deadline.py)."""
        out: asyncio.Queue = asyncio.Queue()  # responses, an error to raise, or END
        room = asyncio.Semaphore(PENDING_ANSWERS)  # taken by a response, freed once written
        sender = asyncio.create_task(self._send_in_turn(requests, context, out, room))
        streams: set[asyncio.Task] = set()

        def drop() -> None:  # the requests sent and the parts coming are dropped
            for task in (sender, *streams):
                task.cancel()

        def streamed(task: asyncio.Task) -> None:  # a streamed answer's parts are all out
            streams.discard(task)
            out.put_nowait(END)

        deadline = WriteDeadline(context, "StreamPredictions2", self.write_timeout, drop)
        try:
            while True:
                item = await out.get()
                if item is END:
                    if sender.done() and not streams:
                        break
                    continue
                if isinstance(item, asyncio.Task):  # a streamed answer's later parts
                    streams.add(item)
                    item.add_done_callback(streamed)
                    continue
                if isinstance(item, BaseException):
                    raise item
                with deadline.writing():
                    yield item
                room.release()
        finally:
            drop()

    async def _send_in_turn(self, requests: AsyncIterator[inference_pb2.PredictionsRequest],
                            context: grpc.aio.ServicerContext, out: asyncio.Queue,
                            room: asyncio.Semaphore) -> None:
        """StreamPredictions2's requests, each sent once the one before has its first answer,
        which goes to ``out`` (and a task that sends on its later parts)."""
        sequence = ""
        try:
            async for request in requests:
                if not request.sequence_id and sequence:
                    request.sequence_id = sequence
                try:
                    reply = await (await self._call(request, context, True))
                except BadRequest as exc:
                    reply = Reply.error(exc)
                except (ControllerGone, TooManyQuestions) as exc:
                    reply = Reply(503, {"code": 503, "type": "ServiceUnavailableException",
                                        "message": str(exc)})
                await room.acquire()  # no next request while the answers wait to be written
                if reply.status >= 400:
                    out.put_nowait(failed(reply.status, reply.body, request.sequence_id))
                    continue
                named = sequence_of(reply)
                out.put_nowait(inference_pb2.PredictionResponse(prediction=reply.body, **named))
                sequence = sequence or named.get("sequence_id", "")
                if reply.stream is not None:
                    out.put_nowait(asyncio.create_task(_parts(reply, named, out, room)))
        except Exception as exc:  # an abort (a bad deadline), the client's stream failing
            out.put_nowait(exc)
        finally:
            out.put_nowait(END)

    async def _predict(self, request: inference_pb2.PredictionsRequest,
                       context: grpc.aio.ServicerContext, stream: bool) -> Reply:
        try:
            call = await self._call(request, context, stream)
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        return await ask(context, call)

    async def _call(self, request: inference_pb2.PredictionsRequest,
                    context: grpc.aio.ServicerContext, stream: bool) -> Awaitable[Reply]:
        """The request, checked and sent to the controller: its answer, to await. Raises
        BadRequest for a request without a model or an input."""
        if not request.model_name:
            raise BadRequest("PredictionsRequest.model_name is required.")
        if not request.input:
            raise BadRequest("PredictionsRequest.input is empty: send at least one input, "
                             "e.g. input={'data': b'...'}.")
        rid = str(uuid.uuid4()).encode()
        names = list(request.input)
        token = metadata_token(context, self.auth)
        headers = forwarded_metadata(context)
        if request.sequence_id:
            headers[protocol.SEQUENCE_ID] = request.sequence_id
        if protocol.SEQUENCE_END in request.input:  # as TorchServe's StreamPredictions2 reads
            # it: per request, where the call's metadata can say it only for all of them
            headers[protocol.SEQUENCE_END] = request.input[protocol.SEQUENCE_END].decode(
                "latin-1")
        frames = protocol.prediction(
            rid, request.model_name, request.model_version or None, token,
            protocol.CODEC_TORCHSERVE, [(n, "application/octet-stream") for n in names],
            headers, [request.input[n] for n in names], timeout_ms=await deadline_ms(context),
            client=peer_client(context), key=headers.get(self.key_header))
        return remembering(self.bridge, protocol.API_INFERENCE, token,
                           self.bridge.call(rid, frames, self.reply_timeout, stream))


class ManagementAPIs(management_pb2_grpc.ManagementAPIsServiceServicer):
    def __init__(self, bridge: AsyncBridge, auth: bool) -> None:
        self.bridge = bridge
        self.auth = auth

    async def _manage(self, op: str, args: dict[str, Any],
                      context: grpc.aio.ServicerContext) -> management_pb2.ManagementResponse:
        args = {k: v for k, v in args.items() if v is not None}
        token = metadata_token(context, self.auth)
        reply = await ask(context, remembering(
            self.bridge, protocol.API_MANAGEMENT, token,
            self.bridge.manage(op, args, token, MANAGE_TIMEOUT)))
        return management_pb2.ManagementResponse(msg=reply.body.decode("utf-8", "replace"))

    async def DescribeModel(
        self, request: management_pb2.DescribeModelRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.ManagementResponse:
        return await self._manage("describe", {"model": request.model_name,
                                               "version": request.model_version or None,
                                               "customized": request.customized or None},
                                  context)

    async def ListModels(
        self, request: management_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.ManagementResponse:
        return await self._manage("list", {"limit": request.limit or None,
                                           "next_page_token": request.next_page_token or None},
                                  context)

    async def RegisterModel(
        self, request: management_pb2.RegisterModelRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.ManagementResponse:
        return await self._manage("register", {
            "url": request.url,
            "model_name": request.model_name or None,
            "handler": request.handler or None,
            "batch_size": request.batch_size or None,
            "max_batch_delay": request.max_batch_delay or None,
            "initial_workers": request.initial_workers or None,
            "response_timeout": request.response_timeout or None,
            "synchronous": "true" if request.synchronous else "false",
        }, context)

    async def ScaleWorker(
        self, request: management_pb2.ScaleWorkerRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.ManagementResponse:
        return await self._manage("scale", {
            "model": request.model_name,
            "version": request.model_version or None,
            "min_worker": request.min_worker,
            "max_worker": request.max_worker or None,
            "synchronous": "true" if request.synchronous else "false",
        }, context)

    async def SetDefault(
        self, request: management_pb2.SetDefaultRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.ManagementResponse:
        return await self._manage("set_default", {"model": request.model_name,
                                                  "version": request.model_version}, context)

    async def UnregisterModel(
        self, request: management_pb2.UnregisterModelRequest, context: grpc.aio.ServicerContext
    ) -> management_pb2.ManagementResponse:
        return await self._manage("unregister", {"model": request.model_name,
                                                 "version": request.model_version or None},
                                  context)
