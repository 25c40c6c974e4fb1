"""TorchServe's protocol (``/predictions``, gRPC ``Predictions``): inputs by name, one row.

A row holds each input under its name (a raw HTTP body is ``body``; a form, one input per
field); values are decoded by their content type (``mservd/worker/payload.py``). The answer is the
handler's output as its status, content type and headers set it; errors are
``{"code", "type", "message"}``.
"""

from __future__ import annotations

import logging
from typing import Any

from mservd import protocol
from mservd.errors import error_body
from mservd.worker.codecs.base import Call, WholeParts, too_large
from mservd.worker.payload import decode_form, decode_input, encode_output, is_form

log = logging.getLogger("mservd.worker")


def as_bytes(content_type: str | None, body: bytes) -> bytearray:
    return bytearray(body)


class TorchServeCodec(WholeParts):
    def decode(self, request: protocol.Request, context: Any) -> Call:
        row: dict[str, Any] = {}
        # decode_input_request=false: every input as the bytes sent, as TorchServe gives them
        read = decode_input if getattr(context, "decode_input_request", True) else as_bytes
        for (name, input_type), payload in zip(request.inputs, request.payloads):
            if is_form(input_type):  # one input per field, by field name
                for field, field_type, data in decode_form(input_type, payload):
                    row[field] = read(field_type, data)
            else:
                row[name] = read(input_type, payload)
        return Call([row])

    def encode(self, call: Call, outputs: list[Any], context: Any,
               limit: int) -> tuple[bytes, bytes]:
        item = outputs[0]
        meta = context.response_meta(call.first)
        try:
            body, content_type = encode_output(item, meta.content_type)
        except Exception as exc:  # TypeError, ValueError, RecursionError, a tolist() that raises
            message = f"Handler output for request {call.first} cannot be encoded: {exc}"
            log.error(message)
            return self.error(500, "InternalServerException", message)
        if len(body) > limit:
            return self.error(500, "InternalServerException", too_large(len(body), limit))
        return protocol.head(meta.status or 200, content_type, meta.headers or None), body

    def error(self, status: int, type_: str, message: str) -> tuple[bytes, bytes]:
        return protocol.head(status), error_body(status, type_, message)


CODEC = TorchServeCodec()
