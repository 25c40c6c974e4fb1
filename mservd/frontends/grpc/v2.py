"""The Open Inference Protocol's ``inference.GRPCInferenceService``.

``ModelInfer`` is turned into the REST binary form (a JSON header, then each input's raw
bytes) and forwarded like ``POST /v2/models/{m}/infer``, every output asked for in binary, so
the worker's one v2 codec serves both transports and batching treats both alike. The binary
answer is split back into ``outputs`` and ``raw_output_contents`` (tritonclient.grpc reads only
those).

Typed contents (``fp32_contents``, ``bytes_contents``, ...) are counted against their input's
shape before anything is converted (a 6 MB message holds 3.2 M empty BYTES elements), and
converted in numpy, a large request's on a thread of its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np

from mservd import __version__, protocol
from mservd.errors import error_message
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.bridge import ControllerGone
from mservd.frontends.grpc.generated import grpc_predict_v2_pb2 as pb
from mservd.frontends.grpc.generated import grpc_predict_v2_pb2_grpc as pb_grpc
from mservd.frontends.grpc.torchserve import (
    ask,
    deadline_ms,
    forwarded_metadata,
    metadata_token,
    peer_client,
    remembering,
)
from mservd.frontends.spaced import TooManyQuestions
from mservd.v2.codec import (
    HEADER_LENGTH,
    NUMPY_TYPES,
    V2Error,
    content_type,
    decode_response,
    to_bytes,
)

log = logging.getLogger(__name__)

EXTENSIONS = ["binary_tensor_data"]
BYTES_CHUNK = 65536  # BYTES elements converted at once
# typed elements past which a request is converted on a thread, one request at a time, so
# that the event loop keeps serving other calls (a 6 MB message holds 3.2 M empty BYTES)
OFF_LOOP_ELEMENTS = 65536

# InferTensorContents field that carries each datatype when raw contents are not used
_CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def parameters(params: Any) -> dict[str, Any]:
    out = {}
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        if which:
            out[key] = getattr(value, which)
    return out


def to_rest_body(request: pb.ModelInferRequest) -> tuple[bytes, int]:
    """The REST binary form of a ModelInferRequest: (body, JSON header length).

    :raises V2Error: raw and typed contents disagree with the inputs (their counts are
        :func:`typed_elements`'s to check, first).
    """
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise V2Error(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} "
                      "inputs; send one per input, in order.")
    inputs, blobs = [], []
    for i, item in enumerate(request.inputs):
        if raw:
            if item.HasField("contents"):  # Triton refuses both forms at once too
                raise V2Error(f"Input {item.name!r} has contents and raw_input_contents; "
                              "send its data in one of them.")
            blob = raw[i]
        else:
            blob = _contents_bytes(item)
        blobs.append(blob)
        entry: dict[str, Any] = {"name": item.name, "datatype": item.datatype,
                                 "shape": list(item.shape),
                                 "parameters": {**parameters(item.parameters),
                                                "binary_data_size": len(blob)}}
        inputs.append(entry)
    doc: dict[str, Any] = {"inputs": inputs, "parameters": {**parameters(request.parameters),
                                                            "binary_data_output": True}}
    if request.id:
        doc["id"] = request.id
    if request.outputs:
        doc["outputs"] = [{"name": o.name, "parameters": {"binary_data": True}}
                          for o in request.outputs]
    header = json.dumps(doc).encode()
    return b"".join([header, *blobs]), len(header)


def typed_elements(request: pb.ModelInferRequest) -> int:
    """How many elements the request's typed contents hold, each input's count checked
    against its shape first (a repeated field's length costs nothing; its conversion does).

    :raises V2Error: an input's typed contents hold another number of elements than its
        shape, or it has a negative dimension.
    """
    if request.raw_input_contents:
        return 0
    total = 0
    for item in request.inputs:
        field = _CONTENTS.get(item.datatype)
        if field is None:
            continue  # refused by _contents_bytes, with the reason
        expected = _elements(item)
        received = len(getattr(item.contents, field))
        if received != expected:
            raise V2Error(f"Input {item.name!r} has shape {list(item.shape)}, so "
                          f"{expected} elements, but contents.{field} holds {received}; send "
                          f"exactly {expected} values, one per element, in row-major order.")
        total += received
    return total


def _elements(item: Any) -> int:
    """The number of elements of an input's shape."""
    if any(dim < 0 for dim in item.shape):
        raise V2Error(f"Input {item.name!r} has shape {list(item.shape)}: a request's shape "
                      "has no wildcard (-1); give each dimension's size.")
    return math.prod(item.shape)


def _contents_bytes(item: Any) -> bytes:
    """An input's typed contents in the binary form (vectorised: a few seconds of Python per
    million elements otherwise)."""
    field = _CONTENTS.get(item.datatype)
    if field is None:
        raise V2Error(f"Input {item.name!r} ({item.datatype}) must be sent in "
                      "raw_input_contents; InferTensorContents has no field for it.")
    values = getattr(item.contents, field)
    if item.datatype == "BYTES":
        return _length_prefixed(values)
    wide = np.array(values)  # the field's own type (int32 for INT8, say): read in C
    if wide.size == 0:
        return b""
    narrow = wide.astype(NUMPY_TYPES[item.datatype])
    if narrow.dtype != wide.dtype and not np.array_equal(narrow, wide):
        raise V2Error(f"Input {item.name!r} ({item.datatype}) has values in contents.{field} "
                      f"outside {item.datatype}'s range; send values that fit it.")
    return narrow.tobytes()


def _length_prefixed(values: Any) -> bytes:
    """BYTES elements as the binary form has them: each a 4-byte little-endian length, then
    its bytes, built in numpy a chunk at a time (bounded scratch memory)."""
    parts = []
    for start in range(0, len(values), BYTES_CHUNK):
        chunk = values[start:start + BYTES_CHUNK]
        lengths = np.fromiter(map(len, chunk), dtype="<u4", count=len(chunk))
        data = np.frombuffer(b"".join(chunk), dtype=np.uint8)
        out = np.empty(4 * len(chunk) + data.size, dtype=np.uint8)
        starts = np.arange(len(chunk), dtype=np.int64) * 4
        starts[1:] += np.cumsum(lengths[:-1], dtype=np.int64)
        prefixes = (starts[:, None] + np.arange(4)).reshape(-1)
        is_data = np.ones(out.size, dtype=bool)
        is_data[prefixes] = False
        out[prefixes] = lengths.view(np.uint8)
        out[is_data] = data
        parts.append(out.tobytes())
    return b"".join(parts)


class GRPCInferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, bridge: AsyncBridge, reply_timeout: float, auth: bool,
                 key_header: str = "x-traffic-key") -> None:
        self.bridge = bridge
        self.key_header = key_header  # the metadata whose value routes among versions
        self.reply_timeout = reply_timeout
        self.auth = auth
        # large typed contents: converted one request at a time, on one thread (one more
        # malloc arena, not one per thread of asyncio's default pool)
        self.converter = ThreadPoolExecutor(1, thread_name_prefix="v2-contents")

    async def _ping(self, context: grpc.aio.ServicerContext) -> int:
        try:  # anyone may ask: spaced (AsyncBridge.ask_open)
            return (await self.bridge.ask_open("ping", {}, None, 10.0)).status
        except (ControllerGone, TooManyQuestions) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise

    async def ServerLive(self, request: pb.ServerLiveRequest,
                         context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        await self._ping(context)
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self._ping(context) == 200)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="mservd", version=__version__,
                                         extensions=EXTENSIONS)

    async def _model(self, op: str, request: pb.ModelReadyRequest | pb.ModelMetadataRequest,
                     context: grpc.aio.ServicerContext) -> dict[str, Any]:
        token = metadata_token(context, self.auth)
        reply = await ask(context, self.bridge.ask_open(  # as over HTTP: anyone may ask, spaced
            op, {"model": request.name, "version": request.version or None}, token, 10.0,
            api=protocol.API_INFERENCE))
        return json.loads(reply.body)

    async def ModelReady(self, request: pb.ModelReadyRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=bool((await self._model("v2_model_ready", request,
                                                                   context))["ready"]))

    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        doc = await self._model("v2_model_metadata", request, context)
        tensors = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=doc["name"], versions=doc["versions"], platform=doc["platform"],
            inputs=[tensors(**t) for t in doc["inputs"]],
            outputs=[tensors(**t) for t in doc["outputs"]])

    async def _rest_body(self, request: pb.ModelInferRequest) -> tuple[bytes, int]:
        """``to_rest_body``, its typed contents' counts checked first; a large conversion
        runs on a thread, one at a time, so it neither stalls the loop nor multiplies."""
        if typed_elements(request) <= OFF_LOOP_ELEMENTS:
            return to_rest_body(request)
        return await asyncio.get_running_loop().run_in_executor(self.converter, to_rest_body,
                                                                request)

    async def ModelInfer(self, request: pb.ModelInferRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        try:
            body, header_length = await self._rest_body(request)
        except V2Error as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        rid = str(uuid.uuid4()).encode()
        token = metadata_token(context, self.auth)
        headers = forwarded_metadata(context)
        frames = protocol.prediction(
            rid, request.model_name, request.model_version or None, token, protocol.CODEC_V2,
            [("v2", content_type(header_length))], headers, [body],
            timeout_ms=await deadline_ms(context), client=peer_client(context),
            key=headers.get(self.key_header))
        reply = await ask(context, remembering(
            self.bridge, protocol.API_INFERENCE, token,
            self.bridge.call(rid, frames, self.reply_timeout)))
        length = reply.headers.get(HEADER_LENGTH)
        try:
            doc, tensors = decode_response(reply.body, int(length) if length else None)
        except (V2Error, ValueError, KeyError) as exc:
            await context.abort(grpc.StatusCode.INTERNAL,
                                f"The model's v2 answer cannot be read: {error_message(reply.body)}"
                                f" ({exc})")
        out = pb.ModelInferResponse(model_name=doc.get("model_name", request.model_name),
                                    model_version=doc.get("model_version", ""),
                                    id=doc.get("id") or request.id)
        for tensor in tensors:
            out.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            out.raw_output_contents.append(to_bytes(tensor))
        return out
