"""OpenAI's API (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``).

The frontend checks the body's fields and forwards what the worker needs of them, as an
``OpenAIRequest`` (``mservd/openai_request.py``), with one input named for the endpoint
(``chat``, ``completion`` or ``embedding``). A
chat or completion request is one row ``{"body": {...}}`` for a generation handler
(``handlers/causal_lm.py``), which answers each step with a text delta; a streamed request gets
each delta as a server-sent event and ``data: [DONE]`` at the end, any other gets one answer
with the whole text. An embedding request is one row per input text, decoded and answered by
``openai_embeddings.py``. A request to a model of the wrong kind (an embedding to a generation
model, a chat to an embedding model) is refused with 400 before it reaches the handler. Errors
are OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from mservd import protocol
from mservd.openai_request import KINDS, OpenAIError, OpenAIRequest
from mservd.worker.codecs import openai_embeddings
from mservd.worker.codecs.base import Call, too_large

SSE = "text/event-stream"
SSE_HEADERS = {"Cache-Control": "no-cache"}


__all__ = ["CODEC", "OpenAIError"]  # OpenAIError: a request this codec refuses (400)


@dataclass
class Exchange:
    """What one OpenAI request needs until its answer is whole."""

    kind: str  # "chat", "completion" or "embedding"
    model: str
    stream: bool
    include_usage: bool
    id: str
    created: int
    text: list[str] = field(default_factory=list)  # the deltas so far, for a whole answer
    started: bool = False  # a streamed chat has sent its first event (the role)


def error_body(status: int, type_: str, message: str) -> bytes:
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": type_}}).encode()


def event(doc: Any) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class OpenAICodec:
    def decode(self, request: protocol.Request, context: Any) -> Call:
        if len(request.inputs) != 1 or request.inputs[0][0] not in KINDS:
            raise OpenAIError("An OpenAI request is one JSON body.")
        try:
            checked = OpenAIRequest.from_payload(request.payloads[0])
        except ValueError as exc:
            raise OpenAIError(str(exc)) from None
        kind = checked.kind
        if kind == "embedding":
            return openai_embeddings.decode(checked, context)
        refused = openai_embeddings.refusal(kind, checked.model, context)
        if refused:
            raise OpenAIError(refused)
        exchange = Exchange(kind, checked.model, checked.stream, checked.include_usage,
                            ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex,
                            int(time.time()))
        return Call([{"body": checked.body}], state=exchange)

    def encode_part(self, call: Call, item: Any, context: Any,
                    limit: int) -> tuple[bytes, bytes] | None:
        exchange: Exchange = call.state
        text = str(item)
        if not exchange.stream:
            exchange.text.append(text)
            return None
        if not text:  # nothing yet: the answer, whose status may yet be an error, waits
            return None
        body = event(self._chunk(exchange, text, None))
        exchange.started = True
        return protocol.head(200, SSE, SSE_HEADERS), body

    def encode(self, call: Call, outputs: list[Any], context: Any,
               limit: int) -> tuple[bytes, bytes]:
        exchange: Exchange = call.state
        if exchange.kind == "embedding":
            try:
                body = openai_embeddings.encode(call.state, outputs)
            except openai_embeddings.EmbeddingRefused as exc:
                return self.error(400, "invalid_value", str(exc))
            content_type, headers = protocol.JSON, None
        else:
            item = outputs[0]
            reason = getattr(item, "finish_reason", None) or "stop"
            usage = usage_of(item)
            if exchange.stream:
                body = event(self._chunk(exchange, str(item), reason))
                if exchange.include_usage:
                    body += event({**self._envelope(exchange), "choices": [], "usage": usage})
                body += b"data: [DONE]\n\n"
                content_type, headers = SSE, SSE_HEADERS
            else:
                text = "".join(exchange.text) + str(item)
                body = json.dumps({**self._envelope(exchange, stream=False),
                                   "choices": [self._choice(exchange, text, reason)],
                                   "usage": usage}).encode()
                content_type, headers = protocol.JSON, None
        if len(body) > limit:
            return self.error(500, "InternalServerException", too_large(len(body), limit))
        return protocol.head(200, content_type, headers), body

    def error(self, status: int, type_: str, message: str) -> tuple[bytes, bytes]:
        return protocol.head(status), error_body(status, type_, message)

    # -- documents ------------------------------------------------------------------------

    @staticmethod
    def _envelope(exchange: Exchange, stream: bool = True) -> dict[str, Any]:
        if exchange.kind == "chat":
            kind = "chat.completion.chunk" if stream else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": exchange.id, "object": kind, "created": exchange.created,
                "model": exchange.model}

    def _chunk(self, exchange: Exchange, text: str, reason: str | None) -> dict[str, Any]:
        if exchange.kind == "chat":
            delta: dict[str, Any] = {"content": text}
            if not exchange.started:
                delta = {"role": "assistant", **delta}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        doc = {**self._envelope(exchange), "choices": [choice]}
        if exchange.include_usage:
            doc["usage"] = None
        return doc

    @staticmethod
    def _choice(exchange: Exchange, text: str, reason: str) -> dict[str, Any]:
        if exchange.kind == "chat":
            return {"index": 0, "message": {"role": "assistant", "content": text},
                    "logprobs": None, "finish_reason": reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}


def usage_of(item: Any) -> dict[str, int]:
    prompt = int(getattr(item, "prompt_tokens", 0) or 0)
    completion = int(getattr(item, "completion_tokens", 0) or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


CODEC = OpenAICodec()
