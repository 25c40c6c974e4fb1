"""OpenAI's API (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``).

The frontend checks the body's fields and forwards what the worker needs of them, as an
``OpenAIRequest`` (``mservd/openai_request.py``), with one input named for the endpoint
(``chat``, ``completion`` or ``embedding``). A
chat or completion request is one row ``{"body": {...}}`` for a generation handler
(``handlers/causal_lm.py``), which answers each step with a text delta; a streamed request gets
each delta as a server-sent event and ``data: [DONE]`` at the end, any other gets one answer
with the whole text. A delta may carry its tokens' ``logprobs`` (chat's shape, with
``text_offset``: ``handlers/logprobs.py``), written here in the shape of the request's
endpoint (chat: ``{content: [{token, logprob, bytes, top_logprobs}]}``; completions:
``{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}``), and the deltas
of its tool calls (``handlers/tool_calls.py``), streamed as ``delta.tool_calls`` and gathered
into ``message.tool_calls`` for a whole answer. An embedding request is one row per input
text, decoded and answered by ``openai_embeddings.py``. A request to a model of the wrong kind (an embedding to a generation
model, a chat to an embedding model) is refused with 400 before it reaches the handler. Errors
are OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import re
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
    logprobs: bool = False  # asked for (chat: logprobs true; completions: logprobs 0 to 5)
    text: list[str] = field(default_factory=list)  # the deltas so far, for a whole answer
    entries: list[dict[str, Any]] = field(default_factory=list)  # their logprobs, likewise
    calls: list[dict[str, Any]] = field(default_factory=list)  # their tool calls, likewise
    started: bool = False  # a streamed chat has sent its first event (the role)

    def gather(self, item: Any) -> None:
        """Keep a delta for the whole answer: its text, logprobs and tool calls."""
        self.text.append(str(item))
        self.entries += getattr(item, "logprobs", None) or []
        for delta in getattr(item, "tool_calls", None) or []:
            function = delta.get("function") or {}
            if "id" in delta:
                self.calls.append({"id": delta["id"], "type": delta.get("type", "function"),
                                   "function": {"name": function.get("name"),
                                                "arguments": ""}})
            if self.calls:
                self.calls[-1]["function"]["arguments"] += function.get("arguments") or ""


# a handler's refusal that begins with the field it refuses, quoted: '"logit_bias" names...'
_FIELD = re.compile(r'"([a-z_]+(?:\.[a-z_]+)*)"')


def error_body(status: int, type_: str, message: str) -> bytes:
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    named = _FIELD.match(message) if 400 <= status < 500 else None
    return json.dumps({"error": {"message": message, "type": kind,
                                 "param": named.group(1) if named else None,
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
        logprobs = checked.body.get("logprobs")
        exchange = Exchange(kind, checked.model, checked.stream, checked.include_usage,
                            ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex,
                            int(time.time()),
                            logprobs is True if kind == "chat" else logprobs is not None)
        return Call([{"body": checked.body}], state=exchange)

    def encode_part(self, call: Call, item: Any, context: Any,
                    limit: int) -> tuple[bytes, bytes] | None:
        exchange: Exchange = call.state
        if not exchange.stream:
            exchange.gather(item)
            return None
        if not str(item) and not getattr(item, "tool_calls", None):
            return None  # nothing yet: the answer, whose status may yet be an error, waits
        body = event(self._chunk(exchange, item, None))
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
                body = event(self._chunk(exchange, item, reason))
                if exchange.include_usage:
                    body += event({**self._envelope(exchange), "choices": [], "usage": usage})
                body += b"data: [DONE]\n\n"
                content_type, headers = SSE, SSE_HEADERS
            else:
                exchange.gather(item)
                body = json.dumps({**self._envelope(exchange, stream=False),
                                   "choices": [self._choice(exchange, reason)],
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

    def _chunk(self, exchange: Exchange, item: Any, reason: str | None) -> dict[str, Any]:
        text, calls = str(item), getattr(item, "tool_calls", None)
        logprobs = logprobs_of(exchange, getattr(item, "logprobs", None) or [])
        if exchange.kind == "chat":
            delta: dict[str, Any] = {"content": text} if text or not calls else {}
            if calls:
                delta["tool_calls"] = calls
            if not exchange.started:
                delta = {"role": "assistant", **delta}
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason}
        doc = {**self._envelope(exchange), "choices": [choice]}
        if exchange.include_usage:
            doc["usage"] = None
        return doc

    @staticmethod
    def _choice(exchange: Exchange, reason: str) -> dict[str, Any]:
        text = "".join(exchange.text)
        logprobs = logprobs_of(exchange, exchange.entries)
        if exchange.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if exchange.calls:
                message.update(content=text or None, tool_calls=exchange.calls)
            return {"index": 0, "message": message, "logprobs": logprobs,
                    "finish_reason": reason}
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason}


def logprobs_of(exchange: Exchange, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The logprobs of a delta's tokens (or a whole answer's) in the endpoint's shape; None
    when the request did not ask for them."""
    if not exchange.logprobs:
        return None
    if exchange.kind == "chat":
        return {"content": [{k: v for k, v in e.items() if k != "text_offset"}
                            for e in entries]}
    tops = []
    for e in entries:
        top = {alt["token"]: alt["logprob"] for alt in e["top_logprobs"]}
        top.setdefault(e["token"], e["logprob"])  # the token picked is always among them
        tops.append(top)
    return {"tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries], "top_logprobs": tops,
            "text_offset": [e["text_offset"] for e in entries]}


def usage_of(item: Any) -> dict[str, int]:
    prompt = int(getattr(item, "prompt_tokens", 0) or 0)
    completion = int(getattr(item, "completion_tokens", 0) or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


CODEC = OpenAICodec()
