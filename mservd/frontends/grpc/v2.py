"""The Open Inference Protocol's ``inference.GRPCInferenceService``.

``ModelInfer`` is turned into the REST binary form (a JSON header, then each input's raw
bytes) and forwarded like ``POST /v2/models/{m}/infer``, every output asked for in binary, so
the worker's one v2 codec serves both transports and batching treats both alike. The binary
answer is split back into ``outputs`` and ``raw_output_contents`` (tritonclient.grpc reads only
those).
"""

from __future__ import annotations

import json
import logging
import uuid
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
    remembering,
)
from mservd.frontends.spaced import TooManyQuestions
from mservd.v2.codec import Tensor, V2Error, decode_response, to_bytes
from mservd.v2.handling import HEADER_LENGTH, content_type

log = logging.getLogger(__name__)

EXTENSIONS = ["binary_tensor_data"]

# InferTensorContents field that carries each datatype when raw contents are not used
_CONTENTS = {
    "BOOL": ("bool_contents", np.bool_), "INT8": ("int_contents", np.int8),
    "INT16": ("int_contents", np.int16), "INT32": ("int_contents", np.int32),
    "INT64": ("int64_contents", np.int64), "UINT8": ("uint_contents", np.uint8),
    "UINT16": ("uint_contents", np.uint16), "UINT32": ("uint_contents", np.uint32),
    "UINT64": ("uint64_contents", np.uint64), "FP32": ("fp32_contents", np.float32),
    "FP64": ("fp64_contents", np.float64), "BYTES": ("bytes_contents", None),
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

    :raises V2Error: raw and typed contents disagree with the inputs.
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


def _contents_bytes(item: Any) -> bytes:
    field, dtype = _CONTENTS.get(item.datatype, (None, None))
    if field is None:
        raise V2Error(f"Input {item.name!r} ({item.datatype}) must be sent in "
                      "raw_input_contents; InferTensorContents has no field for it.")
    values = list(getattr(item.contents, field))
    tensor = Tensor(item.name, item.datatype, list(item.shape),
                    np.array(values, dtype=object if dtype is None else dtype))
    if dtype is None:
        tensor.data[:] = values
    return to_bytes(tensor)


class GRPCInferenceService(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, bridge: AsyncBridge, reply_timeout: float, auth: bool) -> None:
        self.bridge = bridge
        self.reply_timeout = reply_timeout
        self.auth = auth

    async def _ping(self, context) -> int:
        try:  # anyone may ask: spaced (AsyncBridge.ask_open)
            return (await self.bridge.ask_open("ping", {}, None, 10.0)).status
        except (ControllerGone, TooManyQuestions) as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise

    async def ServerLive(self, request, context):
        await self._ping(context)
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=await self._ping(context) == 200)

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="mservd", version=__version__,
                                         extensions=EXTENSIONS)

    async def _model(self, op: str, request, context) -> dict[str, Any]:
        token = metadata_token(context, self.auth)
        reply = await ask(context, self.bridge.ask_open(  # as over HTTP: anyone may ask, spaced
            op, {"model": request.name, "version": request.version or None}, token, 10.0,
            api=protocol.API_INFERENCE))
        return json.loads(reply.body)

    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=bool((await self._model("v2_model_ready", request,
                                                                   context))["ready"]))

    async def ModelMetadata(self, request, context):
        doc = await self._model("v2_model_metadata", request, context)
        tensors = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=doc["name"], versions=doc["versions"], platform=doc["platform"],
            inputs=[tensors(**t) for t in doc["inputs"]],
            outputs=[tensors(**t) for t in doc["outputs"]])

    async def ModelInfer(self, request, context):
        try:
            body, header_length = to_rest_body(request)
        except V2Error as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        rid = str(uuid.uuid4()).encode()
        token = metadata_token(context, self.auth)
        frames = protocol.prediction(
            rid, request.model_name, request.model_version or None, token, protocol.CODEC_V2,
            [("v2", content_type(header_length))], forwarded_metadata(context), [body],
            timeout_ms=await deadline_ms(context))
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
