"""Reranking (``/v1/rerank``, ``/v2/rerank``: Jina's and Cohere's shape, as vLLM serves it) in
the worker: one row per document for a cross-encoder (``handlers/text_reranker.py``), and the
answer from their scores::

    {"id", "model", "results": [{"index", "relevance_score", "document": {"text"}}],
     "usage": {"total_tokens"}}

the results best first (ties in document order), ``top_n`` of them when asked, each with its
document unless ``return_documents`` is false; ``usage.total_tokens`` is the tokens the handler
ran, when its scores say (``Score.prompt_tokens``). The frontend checked the body
(``openai_request.parse_rerank``). A model of another kind is refused (400) before any row
reaches its handler. Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from mservd import protocol
from mservd.openai_request import RERANK, OpenAIError, OpenAIRequest
from mservd.worker.codecs.base import Call, too_large
from mservd.worker.codecs.openai import error_body
from mservd.worker.codecs.openai_embeddings import check_rows, refusal


@dataclass
class Rerank:
    """What one rerank request needs until its answer is whole."""

    model: str
    documents: list[str]
    top_n: int  # 0: all
    return_documents: bool


class RerankCodec:
    def decode(self, request: protocol.Request, context: Any) -> Call:
        if len(request.inputs) != 1 or request.inputs[0][0] != RERANK:
            raise OpenAIError("A rerank request is one JSON body.")
        try:
            checked = OpenAIRequest.from_payload(request.payloads[0])
        except ValueError as exc:
            raise OpenAIError(str(exc)) from None
        refused = refusal(RERANK, checked.model, context)
        if refused:
            raise OpenAIError(refused)
        check_rows(len(checked.texts), '"documents" has {} documents', context)
        query, options = checked.options["query"], checked.options
        state = Rerank(checked.model, checked.texts, int(options.get("top_n") or 0),
                       bool(options.get("return_documents", True)))
        return Call([{"body": {"query": query, "document": d}} for d in checked.texts],
                    state=state)

    def encode_part(self, call: Call, item: Any, context: Any,
                    limit: int) -> tuple[bytes, bytes] | None:
        return None  # a score is never streamed

    def encode(self, call: Call, outputs: list[Any], context: Any,
               limit: int) -> tuple[bytes, bytes]:
        state: Rerank = call.state
        try:
            scores = [float(score) for score in outputs]
        except (TypeError, ValueError):  # a handler of the user's own, which does not rank
            return self.error(400, "BadRequestException", f"Model {state.model!r} answered "
                              f"{type(outputs[0]).__name__}, not a relevance score per "
                              "document: it is no reranker. Send the documents to a "
                              "cross-encoder (a text_reranker model).")
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        if state.top_n:
            order = order[:state.top_n]
        results = []
        for index in order:
            result: dict[str, Any] = {"index": index, "relevance_score": scores[index]}
            if state.return_documents:
                result["document"] = {"text": state.documents[index]}
            results.append(result)
        tokens = sum(int(getattr(score, "prompt_tokens", 0) or 0) for score in outputs)
        body = json.dumps({"id": "rerank-" + uuid.uuid4().hex, "model": state.model,
                           "results": results, "usage": {"total_tokens": tokens}}).encode()
        if len(body) > limit:
            return self.error(500, "InternalServerException", too_large(len(body), limit))
        return protocol.head(200, protocol.JSON), body

    def error(self, status: int, type_: str, message: str) -> tuple[bytes, bytes]:
        return protocol.head(status), error_body(status, type_, message)


CODEC = RerankCodec()
