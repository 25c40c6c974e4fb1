"""Triton's generate extension: ``POST /v2/models/{m}/generate`` and ``/generate_stream``.

``{"text_input": "...", "parameters": {"max_tokens", "temperature", "top_p", "seed", "stop"}}``
in (the parameters may also be top-level fields, as Triton maps them to the model's inputs);
``{"model_name", "model_version", "text_output"}`` out: the whole text from ``/generate``, one
server-sent event per step from ``/generate_stream``. The input is named for the route. Rows
are those of ``handlers/causal_lm.py``. Errors are ``{"error": message}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mservd import protocol
from mservd.worker.codecs.base import Call, too_large

ROUTES = ("generate", "generate_stream")
PARAMETERS = {"max_tokens": "max_tokens", "max_new_tokens": "max_tokens",
              "temperature": "temperature", "top_p": "top_p", "seed": "seed", "stop": "stop",
              "stop_words": "stop", "ignore_eos": "ignore_eos"}
SSE_HEADERS = {"Cache-Control": "no-cache"}


class GenerateError(ValueError):
    """A generate body that cannot be read; its request alone is answered 400."""


@dataclass
class Generation:
    stream: bool
    model_name: str
    model_version: str
    text: list[str] = field(default_factory=list)


class GenerateCodec:
    def decode(self, request: protocol.Request, context: Any) -> Call:
        if len(request.inputs) != 1 or request.inputs[0][0] not in ROUTES:
            raise GenerateError("A generate request is one JSON body.")
        try:
            doc = json.loads(request.payloads[0])
        except (ValueError, RecursionError) as exc:
            raise GenerateError(f"The body is not JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("text_input"), str):
            raise GenerateError('The body must be {"text_input": "...", "parameters": {...}}.')
        parameters = doc.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise GenerateError('"parameters" must be an object.')
        body: dict[str, Any] = {"prompt": doc["text_input"]}
        for source in (doc, parameters):
            for key, name in PARAMETERS.items():
                if key in source:
                    body[name] = source[key]
        version = str(context.manifest.get("model", {}).get("modelVersion", ""))
        state = Generation(request.inputs[0][0] == "generate_stream", context.model_name,
                           version)
        return Call([{"body": body}], state=state)

    def encode_part(self, call: Call, item: Any, context: Any,
                    limit: int) -> tuple[bytes, bytes] | None:
        state: Generation = call.state
        if not state.stream:
            state.text.append(str(item))
            return None
        if not str(item):
            return None
        return protocol.head(200, "text/event-stream", SSE_HEADERS), self._event(state, str(item))

    def encode(self, call: Call, outputs: list[Any], context: Any,
               limit: int) -> tuple[bytes, bytes]:
        state: Generation = call.state
        item = outputs[0]
        if state.stream:
            body = self._event(state, str(item), getattr(item, "finish_reason", None))
            head = protocol.head(200, "text/event-stream", SSE_HEADERS)
        else:
            body = json.dumps(self._doc(state, "".join(state.text) + str(item),
                                        getattr(item, "finish_reason", None))).encode()
            head = protocol.head(200)
        if len(body) > limit:
            return self.error(500, "InternalServerException", too_large(len(body), limit))
        return head, body

    def error(self, status: int, type_: str, message: str) -> tuple[bytes, bytes]:
        return protocol.head(status), json.dumps({"error": message}).encode()

    @staticmethod
    def _doc(state: Generation, text: str, reason: str | None = None) -> dict[str, Any]:
        doc = {"model_name": state.model_name, "model_version": state.model_version,
               "text_output": text}
        if reason is not None:
            doc["finish_reason"] = reason
        return doc

    def _event(self, state: Generation, text: str, reason: str | None = None) -> bytes:
        return b"data: " + json.dumps(self._doc(state, text, reason)).encode() + b"\n\n"


CODEC = GenerateCodec()
