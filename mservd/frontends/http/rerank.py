"""Reranking on the inference port, Jina's and Cohere's shape as vLLM serves it::

    POST /v1/rerank    {"model", "query", "documents": [str or {"text"}], "top_n",
    POST /v2/rerank     "return_documents"} → {"id", "model", "results": [{"index",
    POST /rerank        "relevance_score", "document"}], "usage": {"total_tokens"}}

served by a cross-encoder (the built-in ``text_reranker``, which a transformers folder holding a
one-label ``...ForSequenceClassification`` gets). The body names the model, so it is read and
checked here (``openai_request.parse_rerank``) and forwarded to the model's worker, whose rerank
codec (``mservd/worker/codecs/rerank.py``) makes a row per document and the answer. Errors are
OpenAI's ``{"error": {"message", "type", "param", "code"}}``, as vLLM's. ``routes.py`` declares
the routes.
"""

from __future__ import annotations

from mservd import protocol
from mservd.errors import MservdError
from mservd.frontends.bridge import client_network
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.openai import field_refused
from mservd.frontends.http.request import (
    JSON,
    OPENAI,
    Answer,
    HttpRequest,
    challenged,
    error_body,
    forwarded_headers,
)
from mservd.frontends.http.router import Params
from mservd.openai_request import RERANK, FieldError, parse_rerank


async def rerank(gateway: Gateway, request: HttpRequest, params: Params) -> Answer:
    def frames(rid: bytes, body: bytes) -> list[bytes]:
        checked = parse_rerank(body)
        return protocol.prediction(rid, checked.model, None, gateway.token(request),
                                   protocol.CODEC_RERANK, [(RERANK, JSON)],
                                   forwarded_headers(request.headers), [checked.payload()],
                                   timeout_ms=request.timeout_ms(),
                                   client=client_network(request.client))

    try:
        return await gateway.forward(request, frames, shape=OPENAI, door=False)
    except FieldError as exc:
        return field_refused(exc)
    except MservdError as exc:  # the path alone would give these KServe's shape (/v1/, /v2/)
        return Answer(exc.http_status, error_body(OPENAI, exc.http_status, exc.type,
                                                  exc.message), JSON,
                      challenged(exc.http_status, list(exc.headers.items())))
