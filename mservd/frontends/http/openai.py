"""OpenAI's API on the inference port, also under ``/openai/v1/...`` as KServe serves it::

    POST /v1/chat/completions    messages through the model's chat template
    POST /v1/completions         a prompt
    POST /v1/embeddings          one vector per input text (an embedding model, e.g. minilm)

(``GET /v1/models[/{id}]`` is shared with KServe V1: ``kserve_v1.py`` answers both.) The model
is named in the body, so the body is read and its fields checked here; it then travels as it
came to the model's worker, whose OpenAI codec (``mservd/worker/codecs/openai.py``) makes the rows and
the answer: server-sent events ending ``data: [DONE]`` when ``stream`` is true. Errors are
OpenAI's ``{"error": {"message", "type", "param", "code"}}``; overload is 503 with
``Retry-After``; the bearer token is checked as for every prediction. ``routes.py`` declares
the routes.
"""

from __future__ import annotations

import json
from typing import Any

from mservd import protocol
from mservd.errors import BadRequest, MservdError, ResourceNotFound
from mservd.frontends.bridge import client_network
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.request import (
    OPENAI,
    Answer,
    HttpRequest,
    as_events,
    forwarded_headers,
)
from mservd.frontends.http.router import Params

MAX_STOPS = 4
# Ceilings on what a prompt may be before any worker templates or tokenises it: past any
# context mservd serves (a model's own, lower bounds are its handler's, checked in the worker)
MAX_PROMPT_CHARACTERS = 1_000_000
MAX_MESSAGES = 1024
MAX_ROLE_CHARACTERS = 64
MAX_STOP_CHARACTERS = 256  # each stop string's: the worker matches every token against them


async def chat_completions(gateway: Gateway, request: HttpRequest,
                           params: Params) -> Answer:
    return await _generation(gateway, request, "chat")


async def completions(gateway: Gateway, request: HttpRequest,
                      params: Params) -> Answer:
    return await _generation(gateway, request, "completion")


async def embeddings(gateway: Gateway, request: HttpRequest,
                     params: Params) -> Answer:
    return await _generation(gateway, request, "embedding")


async def _generation(gateway: Gateway, request: HttpRequest, kind: str) -> Answer:
    def frames(rid: bytes, body: bytes) -> list[bytes]:
        doc = check(kind, body)
        return protocol.prediction(rid, doc["model"], None, gateway.token(request),
                                   protocol.CODEC_OPENAI, [(kind, "application/json")],
                                   forwarded_headers(request.headers), [body],
                                   timeout_ms=request.timeout_ms(),
                                   client=client_network(request.client))

    return as_events(await gateway.forward(request, frames, stream=True, shape=OPENAI,
                                           door=False), OPENAI)


def not_found(request: HttpRequest) -> MservdError:
    """A path under OpenAI's prefixes that no route takes."""
    path = request.path.rstrip("/")
    return ResourceNotFound(f"Requested resource is not found: {request.method} {path}. The "
                            "OpenAI routes are /v1/chat/completions, /v1/completions, "
                            "/v1/embeddings and /v1/models.")


def check(kind: str, body: bytes) -> dict[str, Any]:
    """The body's fields, checked as OpenAI checks them.

    :raises BadRequest: a field is missing, of the wrong type or out of range.
    """
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"The body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("The body must be a JSON object.")
    if not isinstance(doc.get("model"), str) or not doc["model"]:
        raise BadRequest('"model" is required: the name of a registered model.')
    if kind == "embedding":
        if "input" not in doc:
            raise BadRequest('"input" is required: a string or a list of strings.')
        return doc
    if kind == "chat":
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise BadRequest('"messages" is required: a list of {"role", "content"}.')
        if len(messages) > MAX_MESSAGES:
            raise BadRequest(f'"messages" has {len(messages)} messages; at most {MAX_MESSAGES} '
                             "are served.")
        if any(len(m["role"]) > MAX_ROLE_CHARACTERS for m in messages):
            raise BadRequest(f'A message\'s "role" has more than {MAX_ROLE_CHARACTERS} '
                             "characters; use system, user, assistant, tool or developer.")
        # every string a chat template may render counts, not only the content
        _characters(sum(len(value) for m in messages for value in m.values()
                        if isinstance(value, str)))
    elif not isinstance(doc.get("prompt"), str):
        raise BadRequest('"prompt" is required and must be a string.')
    else:
        _characters(len(doc["prompt"]))
    if doc.get("n", 1) != 1:
        raise BadRequest('Only "n": 1 is served: one choice per request.')
    _number(doc, "temperature", 0.0, 2.0)
    _number(doc, "top_p", 0.0, 1.0)
    if doc.get("top_p") == 0:  # no token is left to sample from: vLLM refuses it too
        raise BadRequest('"top_p" must be above 0 and at most 1; 0 leaves no token to sample. '
                         "For the likeliest token alone, send \"temperature\": 0.")
    for key in ("max_tokens", "max_completion_tokens", "seed"):
        value = doc.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or (key != "seed" and value < 1)):
            raise BadRequest(f'"{key}" must be a positive integer.')
    stop = doc.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (isinstance(stops, list) and len(stops) <= MAX_STOPS and all(
            isinstance(s, str) and len(s) <= MAX_STOP_CHARACTERS for s in stops)):
        raise BadRequest(f'"stop" must be a string or a list of at most {MAX_STOPS} strings, '
                         f"each of at most {MAX_STOP_CHARACTERS} characters.")
    if not isinstance(doc.get("stream", False), bool):
        raise BadRequest('"stream" must be true or false.')
    options = doc.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest('"stream_options" must be an object.')
    return doc


def _characters(count: int) -> None:
    if count > MAX_PROMPT_CHARACTERS:
        raise BadRequest(f"The prompt has {count} characters; at most {MAX_PROMPT_CHARACTERS} "
                         "are served (and the model's context is far less).")


def _number(doc: dict[str, Any], key: str, low: float, high: float) -> None:
    value = doc.get(key)
    if value is None:
        return
    # JSON's numbers are int and float (a bool is an int to Python, not a number to JSON)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f'"{key}" must be a number from {low:g} to {high:g}.')
