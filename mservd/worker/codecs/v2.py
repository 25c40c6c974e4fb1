"""The Open Inference Protocol v2 (REST ``/v2/.../infer``, gRPC ``ModelInfer``): one row.

The infer body, JSON or binary, is decoded against the model's declared tensors
(model-config.yaml ``v2:``) by ``v2_tensors.py`` beside this file; the answer is an infer
response. Errors are ``{"error": ...}``.
"""

from __future__ import annotations

import logging
from typing import Any

from mservd import protocol
from mservd.v2 import metadata as v2_metadata
from mservd.v2.codec import UnknownOutput, V2Error
from mservd.worker.codecs import v2_tensors
from mservd.worker.codecs.base import Call, WholeParts, too_large

log = logging.getLogger("mservd.worker")


def model_metadata(context: Any) -> v2_metadata.ModelMetadata:
    """The model's v2 metadata (model-config.yaml ``v2:``), read once per worker."""
    meta = getattr(context, "_v2_metadata", None)
    if meta is None:
        meta = context._v2_metadata = v2_metadata.from_model_yaml(context.model_yaml_config)
    return meta


class V2Codec(WholeParts):
    def decode(self, request: protocol.Request, context: Any) -> Call:
        content_type = request.inputs[0][1] if len(request.inputs) == 1 else ""
        if len(request.payloads) != 1:
            raise V2Error("A v2 request is one infer body.")
        row, v2_call = v2_tensors.decode_row(content_type, request.payloads[0],
                                           model_metadata(context))
        return Call([row], state=v2_call)

    def encode(self, call: Call, outputs: list[Any], context: Any,
               limit: int) -> tuple[bytes, bytes]:
        item = outputs[0]
        try:
            body, content_type, headers = v2_tensors.encode_answer(
                call.state, item, model_metadata(context), context.model_name,
                str(context.manifest.get("model", {}).get("modelVersion", "")))
        except Exception as exc:  # V2Error, or whatever the handler's value raises on the way
            message = str(exc) if isinstance(exc, V2Error) else f"{type(exc).__name__}: {exc}"
            if isinstance(exc, UnknownOutput):
                return self.error(400, "BadRequestException", message)
            log.error("v2 answer for model %s cannot be encoded: %s", context.model_name,
                      message)
            return self.error(500, "InternalServerException", message)
        if len(body) > limit:
            return self.error(500, "InternalServerException", too_large(len(body), limit))
        return protocol.head(200, content_type, headers), body

    def error(self, status: int, type_: str, message: str) -> tuple[bytes, bytes]:
        return protocol.head(status), v2_tensors.error_answer(message)


CODEC = V2Codec()
