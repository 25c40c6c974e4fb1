"""OpenAI's request bodies (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``),
read and checked once.

The frontend that takes a request reads its body (the model is named there), checks every
field as OpenAI checks it (:func:`parse`: a 400 names the field) and forwards the worker only
what it needs, as compact JSON (:meth:`OpenAIRequest.payload`); the worker's OpenAI codec
(``worker/codecs/openai.py``) reads that back (:meth:`OpenAIRequest.from_payload`) and makes the
handler's rows from it without checking the fields again. The bounds that depend on the model
(its context, its batch size) are the worker's to check.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from mservd.errors import BadRequest

KINDS = ("chat", "completion", "embedding")  # the input name a request is forwarded with
MAX_STOPS = 4
# Ceilings on what a prompt may be before any worker templates or tokenises it: past any
# context mservd serves (a model's own, lower bounds are its handler's, checked in the worker)
MAX_PROMPT_CHARACTERS = 1_000_000
MAX_MESSAGES = 1024
MAX_ROLE_CHARACTERS = 64
MAX_STOP_CHARACTERS = 256  # each stop string's: the worker matches every token against them
# the fields a generation handler reads (handlers/causal_lm.py), of a checked body
GENERATION_FIELDS = ("messages", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop",
                     "ignore_eos")


@dataclass
class OpenAIRequest:
    """A checked OpenAI request: what the worker needs of it, and nothing else."""

    kind: str  # "chat", "completion" or "embedding"
    model: str
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    body: dict[str, Any] = field(default_factory=dict)  # a generation's fields, for its handler
    texts: list[str] = field(default_factory=list)  # an embedding's inputs, one row each

    def payload(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_payload(cls, payload: bytes) -> OpenAIRequest:
        """What :meth:`payload` wrote; a frontend checked it, so only its shape is read."""
        try:
            return cls(**json.loads(payload))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"An OpenAI request as the frontend forwards it, not {exc}") \
                from None


def parse(kind: str, body: bytes) -> OpenAIRequest:
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
    if not isinstance(doc.get("stream", False), bool):
        raise BadRequest('"stream" must be true or false.')
    options = doc.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest('"stream_options" must be an object.')
    request = OpenAIRequest(kind, doc["model"], bool(doc.get("stream")),
                            bool(options and options.get("include_usage")))
    if kind == "embedding":
        texts = doc.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(
                isinstance(t, str) for t in texts):
            raise BadRequest('"input" is required: a string or a list of strings.')
        request.texts = texts
        return request
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
        doc.pop("prompt", None)
    elif not isinstance(doc.get("prompt"), str):
        raise BadRequest('"prompt" is required and must be a string.')
    else:
        _characters(len(doc["prompt"]))
        doc.pop("messages", None)
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
    if "max_completion_tokens" in doc and "max_tokens" not in doc:
        doc["max_tokens"] = doc["max_completion_tokens"]
    request.body = {k: doc[k] for k in GENERATION_FIELDS if k in doc}
    return request


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
