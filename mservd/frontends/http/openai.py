"""OpenAI's API on the inference port, also under ``/openai/v1/...`` as KServe serves it::

    POST /v1/chat/completions    messages through the model's chat template
    POST /v1/completions         a prompt
    POST /v1/embeddings          one vector per input text (an embedding model, e.g. minilm)

(``GET /v1/models[/{id}]`` is shared with KServe V1: ``kserve_v1.py`` answers both.) The model
is named in the body, so the body is read and its fields checked here
(``mservd/openai_request.py``); what the worker needs of it travels to the model's worker, whose
OpenAI codec (``mservd/worker/codecs/openai.py``) makes the rows and the answer: server-sent
events ending ``data: [DONE]`` when ``stream`` is true. A request of several choices (``n``, a
list of prompts) is one request to the worker per choice, merged here
(``openai_choices.py``). Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}``; overload is 503 with
``Retry-After``; the bearer token is checked as for every prediction. ``routes.py`` declares
the routes.
"""

from __future__ import annotations

import json
import re
import uuid

from mservd import protocol
from mservd.errors import MservdError, ResourceNotFound
from mservd.frontends.bridge import client_network
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.openai_choices import fan_out
from mservd.frontends.http.request import (
    OPENAI,
    Answer,
    HttpRequest,
    as_events,
    forwarded_headers,
)
from mservd.frontends.http.router import Params
from mservd.openai_request import FieldError, OpenAIRequest, parse


async def chat_completions(gateway: Gateway, request: HttpRequest,
                           params: Params) -> Answer:
    return await _generation(gateway, request, "chat")


async def completions(gateway: Gateway, request: HttpRequest,
                      params: Params) -> Answer:
    return await _generation(gateway, request, "completion")


async def embeddings(gateway: Gateway, request: HttpRequest,
                     params: Params) -> Answer:
    return await _generation(gateway, request, "embedding")


class _Choices(Exception):
    """The request has several choices: each is forwarded on its own (``openai_choices``)."""

    def __init__(self, checked: OpenAIRequest, choices: list[OpenAIRequest]) -> None:
        super().__init__()
        self.checked, self.choices = checked, choices


async def _generation(gateway: Gateway, request: HttpRequest, kind: str) -> Answer:
    def frames(rid: bytes, body: bytes) -> list[bytes]:
        checked = parse(kind, body)
        choices = checked.choices()
        if len(choices) > 1:
            raise _Choices(checked, choices)
        return _prediction(gateway, request, kind, rid, choices[0])

    try:
        return _answer(await gateway.forward(request, frames, stream=True, shape=OPENAI,
                                             door=False), kind)
    except FieldError as exc:
        return field_refused(exc)
    except _Choices as several:
        group = str(uuid.uuid4())  # the choices of one request: one version of the model

        async def forward(again: HttpRequest, choice: OpenAIRequest) -> Answer:
            def one(rid: bytes, body: bytes) -> list[bytes]:
                return _prediction(gateway, again, kind, rid, choice)

            return _answer(await gateway.forward(again, one, stream=True, shape=OPENAI,
                                                 door=False, group=group), kind)

        return await fan_out(request, several.choices, several.checked.n, forward)


def _prediction(gateway: Gateway, request: HttpRequest, kind: str, rid: bytes,
                checked: OpenAIRequest) -> list[bytes]:
    return protocol.prediction(rid, checked.model, None, gateway.token(request),
                               protocol.CODEC_OPENAI, [(kind, "application/json")],
                               forwarded_headers(request.headers), [checked.payload()],
                               timeout_ms=request.timeout_ms(),
                               client=client_network(request.client))


def _answer(answer: Answer, kind: str) -> Answer:
    """The worker's answer as the client gets it: a context overflow with OpenAI's code, a
    stream's every part an event."""
    if answer.status == 400 and answer.stream is None:
        answer.body = context_exceeded(answer.body, "messages" if kind == "chat" else "prompt")
    return as_events(answer, OPENAI)


# the generation handler's refusal of a prompt (and max_tokens) past the model's context
# (handlers/causal_lm.py): OpenAI's code for it, which clients (LangChain's trimming) look for
_CONTEXT_EXCEEDED = re.compile(rb'"message": "The prompt has \d+ tokens')


def context_exceeded(body: bytes, param: str) -> bytes:
    """An OpenAI error body, with ``code: "context_length_exceeded"`` when it says the prompt
    is past the context."""
    if not _CONTEXT_EXCEEDED.search(body):
        return body
    try:
        doc = json.loads(body)
        doc["error"].update(code="context_length_exceeded", param=param)
    except (ValueError, TypeError, KeyError, AttributeError):
        return body
    return json.dumps(doc).encode()


def field_refused(exc: FieldError) -> Answer:
    """A field refused, with OpenAI's ``param`` naming it and its ``code``."""
    return Answer(exc.http_status, json.dumps({"error": {
        "message": exc.message, "type": "invalid_request_error", "param": exc.param,
        "code": exc.code}}).encode())


def not_found(request: HttpRequest) -> MservdError:
    """A path under OpenAI's prefixes that no route takes."""
    path = request.path.rstrip("/")
    return ResourceNotFound(f"Requested resource is not found: {request.method} {path}. The "
                            "OpenAI routes are /v1/chat/completions, /v1/completions, "
                            "/v1/embeddings and /v1/models.")
