"""OpenAI's request bodies (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``),
read and checked once.

The frontend that takes a request reads its body (the model is named there), checks every
field as OpenAI checks it (:func:`parse`: a 400 names the field in OpenAI's ``param``) and
forwards the worker only what it needs, as compact JSON (:meth:`OpenAIRequest.payload`); the
worker's OpenAI codec (``worker/codecs/openai.py``) reads that back
(:meth:`OpenAIRequest.from_payload`) and makes the handler's rows from it without checking the
fields again. The bounds that depend on the model (its context, its batch size) are the
worker's to check.

What is read, as OpenAI's clients send it:

- ``null`` for any optional field is the field absent (clients serialise their defaults so);
- a field OpenAI does not define is ignored (clients send vendor extras); a field OpenAI
  defines and mservd does not serve is a 400 naming it (:data:`REFUSED`), never dropped;
- a message's ``content`` is a string or a list of text parts, joined by newlines (as vLLM
  does) before it is forwarded; any other part (``image_url``, ``input_audio``, ``file``...)
  is a 400 naming its type;
- a generation's body as its handler reads it (:data:`GENERATION_FIELDS`), with ``kind``
  ("chat" or "completion") so that the handler knows which shape ``logprobs`` has.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from mservd.errors import BadRequest

KINDS = ("chat", "completion", "embedding")  # the input name a request is forwarded with
RERANK = "rerank"  # a rerank request's kind and input name (its own codec: codecs/rerank.py)
MAX_STOPS = 4
# Ceilings on what a prompt may be before any worker templates or tokenises it: past any
# context mservd serves (a model's own, lower bounds are its handler's, checked in the worker)
MAX_PROMPT_CHARACTERS = 1_000_000
MAX_MESSAGES = 1024
MAX_ROLE_CHARACTERS = 64
MAX_STOP_CHARACTERS = 256  # each stop string's: the worker matches every token against them
MAX_TOOLS = 128  # OpenAI's own bound
MAX_LOGIT_BIAS = 300  # OpenAI's own bound: entries of logit_bias
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI's
MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs, as OpenAI's
MAX_N = 8  # choices of one prompt ("n")
MAX_CHOICES = 64  # choices of one request: prompts x n, each its own request to the worker
ROLES = ("system", "developer", "user", "assistant", "tool")
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a function's or a JSON schema's name, as OpenAI's
# the fields a generation handler reads (handlers/causal_lm.py), of a checked body
GENERATION_FIELDS = ("kind", "messages", "prompt", "prompt_token_ids", "max_tokens",
                     "temperature", "top_p", "seed", "stop", "ignore_eos", "logprobs",
                     "top_logprobs", "response_format", "tools", "tool_choice",
                     "parallel_tool_calls", "presence_penalty", "frequency_penalty",
                     "logit_bias")
#: Fields OpenAI's reference defines that mservd does not serve: a 400 naming each (when
#: present and not null), and why.
REFUSED = {
    "audio": "audio output is not served; the models answer text.",
    "prediction": "predicted outputs are not served.",
    "web_search_options": "web search is not served.",
    "functions": "the deprecated \"functions\" is not served; send \"tools\" (each "
                 "{\"type\": \"function\", \"function\": {...}}).",
    "function_call": "the deprecated \"function_call\" is not served; send \"tool_choice\".",
    "reasoning_effort": "it is for reasoning models; the models served here do not reason "
                        "apart from their answer.",
    "verbosity": "it is for reasoning models; send \"max_tokens\" to bound an answer.",
}
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")


#: The built-in handlers by the kind of model they serve (a handler's file or module name)
HANDLER_KINDS = {"causal_lm": "generation", "text_embedder": "embedding",
                 "text_reranker": "rerank"}
#: The kind of model each endpoint needs
ENDPOINT_KINDS = {"chat": "generation", "completion": "generation", "embedding": "embedding",
                  "rerank": "rerank"}
ENDPOINTS = {"chat": "/v1/chat/completions", "completion": "/v1/completions",
             "embedding": "/v1/embeddings", "rerank": "/v1/rerank"}


def model_kind(handler: str, settings: dict[str, Any]) -> str | None:
    """The kind of model a handler serves: "generation", "embedding" or "rerank" for the
    built-in handlers (by name, as an archive or a model folder names them: ``causal_lm``,
    ``causal_lm.py``, ``handlers/causal_lm.py:fn``), "generation" for any model that batches
    continuously (``settings``: its model-config.yaml), else None: a handler of the user's
    own, which may serve what it likes."""
    name = handler.rsplit("/", 1)[-1].split(":", 1)[0].removesuffix(".py")
    kind = HANDLER_KINDS.get(name)
    if kind is None and settings.get("continuousBatching") is True:
        kind = "generation"
    return kind


def wrong_kind(endpoint: str, model: str, handler: str, settings: dict[str, Any]) -> str | None:
    """Why ``model`` cannot serve ``endpoint`` ("chat", "completion", "embedding", "rerank"),
    or None when it can (or its handler is the user's own, and may)."""
    kind = model_kind(handler, settings)
    wanted = ENDPOINT_KINDS[endpoint]
    if kind is None or kind == wanted:
        return None
    serves = [ENDPOINTS[e] for e, k in ENDPOINT_KINDS.items() if k == kind]
    return (f"Model {model!r} is {_article(kind)} {kind} model: it serves "
            f"{' and '.join(serves)}, not {ENDPOINTS[endpoint]}, which needs {_article(wanted)} "
            f"{wanted} model.")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


class OpenAIError(ValueError):
    """A forwarded request its worker cannot serve (a model of the wrong kind, more texts
    than a batch): that request alone is answered 400 with the message."""


class FieldError(BadRequest):
    """A field refused, with OpenAI's ``param`` (the field's path, e.g. ``messages[1].role``)
    and ``code`` (``invalid_value``, ``invalid_type``, ``unsupported_parameter``...)."""

    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass
class OpenAIRequest:
    """A checked OpenAI request: what the worker needs of it, and nothing else."""

    kind: str  # "chat", "completion" or "embedding"
    model: str
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    body: dict[str, Any] = field(default_factory=dict)  # a generation's fields, for its handler
    texts: list[str] = field(default_factory=list)  # an embedding's inputs, one row each
    # an embedding's encoding_format ("float" or "base64") and dimensions, when sent
    options: dict[str, Any] = field(default_factory=dict)
    n: int = 1  # choices of each prompt: :meth:`choices` makes one request of each

    def choices(self) -> list[OpenAIRequest]:
        """One request per choice, as each travels to the worker: each prompt of a list
        (a string, or token ids as ``prompt_token_ids``) ``n`` times, in OpenAI's order
        (choice ``index`` = prompt's index x n + i); with a ``seed``, choice i of a prompt
        samples with seed + i, so that the choices differ and repeat. A request of one choice
        is itself."""
        if self.n == 1 and not isinstance(self.body.get("prompt"), list):
            return [self]
        prompts = prompt_list(self.body["prompt"]) if "prompt" in self.body else [None]
        seed = self.body.get("seed")
        out = []
        for prompt in prompts:
            for i in range(self.n):
                body = {k: v for k, v in self.body.items() if k != "prompt"}
                if isinstance(prompt, list):
                    body["prompt_token_ids"] = prompt
                elif prompt is not None:
                    body["prompt"] = prompt
                if seed is not None:
                    body["seed"] = seed + i
                out.append(OpenAIRequest(self.kind, self.model, self.stream,
                                         self.include_usage, body))
        return out

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

    :raises FieldError: a field is missing, of the wrong type, out of range, or not served.
    :raises BadRequest: the body is no JSON object.
    """
    doc = _document(body)
    _boolean(doc, "stream")
    options = doc.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise FieldError("stream_options", '"stream_options" must be an object.',
                         "invalid_type")
    usage = (options or {}).get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise FieldError("stream_options.include_usage",
                         '"stream_options.include_usage" must be true or false.', "invalid_type")
    request = OpenAIRequest(kind, doc["model"], bool(doc.get("stream")), bool(usage))
    if kind == "embedding":
        texts = doc.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(
                isinstance(t, str) for t in texts):
            raise FieldError("input", '"input" is required: a string or a list of strings '
                             "(token ids are not served: the handler tokenises).")
        request.texts = texts
        request.options = _embedding_options(doc)
        return request
    for key, why in REFUSED.items():
        if key in doc:
            raise FieldError(key, f'"{key}" is not supported: {why}', "unsupported_parameter")
    if doc.get("modalities", ["text"]) != ["text"]:
        raise FieldError("modalities", '"modalities" may only be ["text"]: the models served '
                         "here answer text.", "unsupported_parameter")
    if doc.get("store") is True:
        raise FieldError("store", '"store": true is not supported: mservd keeps no '
                         "completions.", "unsupported_parameter")
    if kind == "chat":
        doc["messages"] = _messages(doc.get("messages"))
        doc.pop("prompt", None)
        _tools(doc)
        _response_format(doc)
        _chat_logprobs(doc)
    else:
        _completion_only(doc)
        prompts = prompt_list(doc.get("prompt"))
        _characters(sum(len(p) for p in prompts), "prompt")
        doc.pop("messages", None)
        for key in ("tools", "tool_choice", "parallel_tool_calls"):
            if key in doc:
                raise FieldError(key, f'"{key}" is a chat field: send the request to '
                                 "/v1/chat/completions.", "unsupported_parameter")
        _response_format(doc)  # not OpenAI's on completions; vLLM's, and served alike
        logprobs = doc.get("logprobs")
        if logprobs is not None and not _integer_in(logprobs, 0, MAX_COMPLETION_LOGPROBS):
            raise FieldError("logprobs", '"logprobs" must be an integer from 0 to '
                             f"{MAX_COMPLETION_LOGPROBS}: how many likeliest tokens to show "
                             "beside each chosen one.")
        doc.pop("top_logprobs", None)  # a chat field; not OpenAI's on completions
    n = doc.get("n", 1)
    if not _integer_in(n, 1, MAX_N):
        raise FieldError("n", f'"n" must be an integer from 1 to {MAX_N}: the choices of each '
                         "prompt.")
    many = len(prompt_list(doc["prompt"])) if kind == "completion" else 1
    if many * n > MAX_CHOICES:
        raise FieldError("n" if many == 1 else "prompt",
                         f"{many} prompts x n {n} is {many * n} choices; at most "
                         f"{MAX_CHOICES} are served in one request.")
    request.n = n
    _number(doc, "temperature", 0.0, 2.0)
    _number(doc, "top_p", 0.0, 1.0)
    if doc.get("top_p") == 0:  # no token is left to sample from: vLLM refuses it too
        raise FieldError("top_p", '"top_p" must be above 0 and at most 1; 0 leaves no token '
                         'to sample. For the likeliest token alone, send "temperature": 0.')
    _number(doc, "presence_penalty", -2.0, 2.0)
    _number(doc, "frequency_penalty", -2.0, 2.0)
    _logit_bias(doc)
    for key in ("max_tokens", "max_completion_tokens", "seed"):
        value = doc.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or (key != "seed" and value < 1)):
            raise FieldError(key, f'"{key}" must be a positive integer.')
    stop = doc.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (isinstance(stops, list) and len(stops) <= MAX_STOPS and all(
            isinstance(s, str) and len(s) <= MAX_STOP_CHARACTERS for s in stops)):
        raise FieldError("stop", f'"stop" must be a string or a list of at most {MAX_STOPS} '
                         f"strings, each of at most {MAX_STOP_CHARACTERS} characters.")
    _boolean(doc, "ignore_eos")
    if "max_completion_tokens" in doc and "max_tokens" not in doc:
        doc["max_tokens"] = doc["max_completion_tokens"]
    doc["kind"] = kind
    request.body = {k: doc[k] for k in GENERATION_FIELDS if k in doc}
    return request


def _document(body: bytes) -> dict[str, Any]:
    """The body's JSON object, its nulls dropped (a null is the field absent), and its model.

    :raises BadRequest: no JSON object. :raises FieldError: no model named.
    """
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"The body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("The body must be a JSON object.")
    doc = {key: value for key, value in doc.items() if value is not None}
    if not isinstance(doc.get("model"), str) or not doc["model"]:
        raise FieldError("model", '"model" is required: the name of a registered model.',
                         "missing_required_parameter")
    return doc


# -- chat -----------------------------------------------------------------------------------

def _messages(messages: Any) -> list[dict[str, Any]]:
    """The messages as the handler's chat template takes them: each checked, its content a
    string (text parts joined), only the fields a template reads."""
    if not isinstance(messages, list) or not messages:
        raise FieldError("messages", '"messages" is required: a list of {"role", "content"}.',
                         "missing_required_parameter")
    if len(messages) > MAX_MESSAGES:
        raise FieldError("messages", f'"messages" has {len(messages)} messages; at most '
                         f"{MAX_MESSAGES} are served.")
    checked = [_message(i, m) for i, m in enumerate(messages)]
    # every string a chat template may render counts, not only the content
    _characters(_length(checked))
    return checked


def _message(i: int, message: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise FieldError(where, f"{where} must be an object with a \"role\" and a "
                         '"content".', "invalid_type")
    message = {k: v for k, v in message.items() if v is not None}
    role = message.get("role")
    if role not in ROLES:
        shown = repr(role)[:MAX_ROLE_CHARACTERS] if isinstance(role, str) else "missing"
        raise FieldError(f"{where}.role", f"Invalid value for {where}.role: {shown}. "
                         "Supported values are: 'system', 'developer', 'user', 'assistant' "
                         "and 'tool'.")
    out: dict[str, Any] = {"role": role}
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            raise FieldError(f"{where}.tool_calls", f"{where}.tool_calls is only for "
                             "assistant messages.", "unsupported_parameter")
        out["tool_calls"] = [_tool_call(f"{where}.tool_calls[{j}]", call)
                             for j, call in enumerate(_list(f"{where}.tool_calls",
                                                            tool_calls))]
    content = message.get("content")
    if content is None:
        if not tool_calls:
            raise FieldError(f"{where}.content", f"{where}.content is required (a string or "
                             "a list of text parts); only an assistant message with "
                             "tool_calls may leave it null.", "missing_required_parameter")
        out["content"] = None
    else:
        out["content"] = _content(f"{where}.content", content)
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise FieldError(f"{where}.name", f"{where}.name must be a string.",
                             "invalid_type")
        out["name"] = name
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise FieldError(f"{where}.tool_call_id", f"{where}.tool_call_id is required: "
                             "the id of the assistant's tool call this message answers.",
                             "missing_required_parameter")
        out["tool_call_id"] = call_id
    return out


def _content(where: str, content: Any) -> str:
    """A message's content as one string: a string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    parts = _list(where, content, "a string or a list of text parts")
    if not parts:
        raise FieldError(where, f"{where} is an empty list; send a string or at least one "
                         'part {"type": "text", "text": "..."}.')
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise FieldError(f"{where}[{j}]", f'{where}[{j}] must be a part {{"type": "text", '
                             '"text": "..."}.', "invalid_type")
        if part.get("type") != "text":
            kind = part.get("type")
            raise FieldError(f"{where}[{j}].type", f"{where}[{j}] is a part of type "
                             f"{str(kind)[:64]!r}; only \"text\" parts are served: the models "
                             "here read text.", "unsupported_value" if kind else "invalid_value")
        if not isinstance(part.get("text"), str):
            raise FieldError(f"{where}[{j}].text", f"{where}[{j}].text must be a string.",
                             "invalid_type")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_call(where: str, call: Any) -> dict[str, Any]:
    """One of an assistant message's tool_calls: {id, type: "function", function: {name,
    arguments}}, as the model answered it before."""
    if not isinstance(call, dict) or call.get("type", "function") != "function":
        raise FieldError(where, f'{where} must be {{"id", "type": "function", "function": '
                         '{"name", "arguments"}}.', "invalid_type")
    function = call.get("function")
    if not (isinstance(call.get("id"), str) and isinstance(function, dict)
            and isinstance(function.get("name"), str)
            and isinstance(function.get("arguments"), str)):
        raise FieldError(where, f'{where} must be {{"id", "type": "function", "function": '
                         '{"name", "arguments"}}, its arguments a JSON text.', "invalid_type")
    return {"id": call["id"], "type": "function",
            "function": {"name": function["name"], "arguments": function["arguments"]}}


def _tools(doc: dict[str, Any]) -> None:
    tools = doc.get("tools")
    if tools is not None:
        tools = _list("tools", tools, "a list of functions")
        if len(tools) > MAX_TOOLS:
            raise FieldError("tools", f'"tools" has {len(tools)} tools; at most {MAX_TOOLS} '
                             "are served, as OpenAI's.")
        doc["tools"] = [_tool(i, tool) for i, tool in enumerate(tools)]
        _characters(_length(doc["messages"]) + _length(doc["tools"]), "tools")
        if not doc["tools"]:
            del doc["tools"]
    declared = [t["function"]["name"] for t in doc.get("tools", ())]
    choice = doc.get("tool_choice")
    if choice is not None:
        if isinstance(choice, dict):
            function = choice.get("function")
            if choice.get("type") != "function" or not isinstance(function, dict) \
                    or not isinstance(function.get("name"), str):
                raise FieldError("tool_choice", '"tool_choice" must be "none", "auto", '
                                 '"required" or {"type": "function", "function": {"name"}}.')
            if function["name"] not in declared:
                raise FieldError("tool_choice", f'"tool_choice" names the function '
                                 f"{function['name'][:64]!r}, which \"tools\" does not "
                                 f"declare (it declares {declared!r:.200}).")
            doc["tool_choice"] = {"type": "function", "function": {"name": function["name"]}}
        elif choice not in ("none", "auto", "required"):
            raise FieldError("tool_choice", '"tool_choice" must be "none", "auto", '
                             '"required" or {"type": "function", "function": {"name"}}.')
        elif choice != "none" and not declared:
            raise FieldError("tool_choice", '"tool_choice" is only allowed when "tools" are '
                             "specified.")
    if "parallel_tool_calls" in doc:
        _boolean(doc, "parallel_tool_calls")
        if not declared:
            raise FieldError("parallel_tool_calls", '"parallel_tool_calls" is only allowed '
                             'when "tools" are specified.')


def _tool(i: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise FieldError(where, f'{where} must be {{"type": "function", "function": {{...}}}}.',
                         "invalid_type")
    if tool.get("type") != "function":
        raise FieldError(f"{where}.type", f"{where}.type is {str(tool.get('type'))[:64]!r}; "
                         'only "function" tools are served.')
    function = tool.get("function")
    if not isinstance(function, dict):
        raise FieldError(f"{where}.function", f'{where}.function must be {{"name", '
                         '"description", "parameters"}.', "invalid_type")
    function = {k: v for k, v in function.items() if v is not None}
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise FieldError(f"{where}.function.name", f"{where}.function.name must be 1 to 64 "
                         "letters, digits, underscores or dashes.")
    out: dict[str, Any] = {"name": name}
    if "description" in function:
        if not isinstance(function["description"], str):
            raise FieldError(f"{where}.function.description",
                             f"{where}.function.description must be a string.", "invalid_type")
        out["description"] = function["description"]
    if "parameters" in function:
        if not isinstance(function["parameters"], dict):
            raise FieldError(f"{where}.function.parameters", f"{where}.function.parameters "
                             "must be a JSON Schema object.", "invalid_type")
        out["parameters"] = function["parameters"]
    if "strict" in function:
        if not isinstance(function["strict"], bool):
            raise FieldError(f"{where}.function.strict", f"{where}.function.strict must be "
                             "true or false.", "invalid_type")
        out["strict"] = function["strict"]
    return {"type": "function", "function": out}


def _chat_logprobs(doc: dict[str, Any]) -> None:
    _boolean(doc, "logprobs")
    top = doc.get("top_logprobs")
    if top is None:
        return
    if not _integer_in(top, 0, MAX_TOP_LOGPROBS):
        raise FieldError("top_logprobs", f'"top_logprobs" must be an integer from 0 to '
                         f"{MAX_TOP_LOGPROBS}.")
    if doc.get("logprobs") is not True:
        raise FieldError("top_logprobs", '"top_logprobs" needs "logprobs": true.')


# -- both generations -----------------------------------------------------------------------

def _response_format(doc: dict[str, Any]) -> None:
    """``response_format``: text (the default: dropped), json_object or json_schema."""
    value = doc.get("response_format")
    if value is None:
        return
    if not isinstance(value, dict) or value.get("type") not in (
            "text", "json_object", "json_schema"):
        raise FieldError("response_format", '"response_format" must be {"type": "text"}, '
                         '{"type": "json_object"} or {"type": "json_schema", "json_schema": '
                         '{"name", "schema", "strict"}}.')
    kind = value["type"]
    if kind == "text":
        del doc["response_format"]
        return
    if kind == "json_object":
        doc["response_format"] = {"type": kind}
        return
    schema = value.get("json_schema")
    if not isinstance(schema, dict):
        raise FieldError("response_format.json_schema", '"response_format.json_schema" is '
                         'required with "type": "json_schema": {"name", "schema", "strict"}.',
                         "missing_required_parameter")
    schema = {k: v for k, v in schema.items() if v is not None}
    if not isinstance(schema.get("name"), str) or not NAME.fullmatch(schema["name"]):
        raise FieldError("response_format.json_schema.name",
                         '"response_format.json_schema.name" must be 1 to 64 letters, digits, '
                         "underscores or dashes.")
    if not isinstance(schema.get("schema"), dict):
        raise FieldError("response_format.json_schema.schema",
                         '"response_format.json_schema.schema" must be a JSON Schema object.',
                         "invalid_type")
    if not isinstance(schema.get("strict", False), bool):
        raise FieldError("response_format.json_schema.strict",
                         '"response_format.json_schema.strict" must be true or false.',
                         "invalid_type")
    out = {k: schema[k] for k in ("name", "description", "schema", "strict") if k in schema}
    if not isinstance(out.get("description", ""), str):
        raise FieldError("response_format.json_schema.description",
                         '"response_format.json_schema.description" must be a string.',
                         "invalid_type")
    _characters(_length(out), "response_format")
    doc["response_format"] = {"type": kind, "json_schema": out}


def prompt_list(prompt: Any) -> list[str | list[int]]:
    """A completion's ``prompt`` as a list of prompts, each a string or a list of token ids:
    as OpenAI takes it, a string, a list of strings, a list of token ids, or a list of such
    lists.

    :raises FieldError: anything else.
    """
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(_token_id(t) for t in prompt):
            return [prompt]
        if all(isinstance(p, list) and p and all(_token_id(t) for t in p) for p in prompt):
            return list(prompt)
    raise FieldError("prompt", '"prompt" is required: a string, a list of strings, a list of '
                     "token ids, or a list of lists of token ids (none empty).")


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31


def _completion_only(doc: dict[str, Any]) -> None:
    """Completions' own fields that mservd does not serve, unless at their defaults."""
    if doc.get("echo", False) is not False:
        raise FieldError("echo", '"echo" is not supported: the answer is the completion '
                         "alone.", "unsupported_parameter")
    if doc.get("suffix", "") != "":
        raise FieldError("suffix", '"suffix" is not supported (insertion needs a model '
                         "trained for it).", "unsupported_parameter")
    if doc.get("best_of", 1) not in (1, doc.get("n", 1)):
        raise FieldError("best_of", '"best_of" is not supported: send "n" for several '
                         "choices.", "unsupported_parameter")


def _logit_bias(doc: dict[str, Any]) -> None:
    bias = doc.get("logit_bias")
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise FieldError("logit_bias", '"logit_bias" must be an object of token id -> bias '
                         "(-100 to 100).", "invalid_type")
    if len(bias) > MAX_LOGIT_BIAS:
        raise FieldError("logit_bias", f'"logit_bias" has {len(bias)} entries; at most '
                         f"{MAX_LOGIT_BIAS} are served, as OpenAI's.")
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10):
            raise FieldError("logit_bias", f'"logit_bias" has the key {key[:32]!r}: each key '
                             "is a token id (a decimal integer as a string).")
        if not isinstance(value, (int, float)) or isinstance(value, bool) \
                or not -100 <= value <= 100:
            raise FieldError("logit_bias", f'"logit_bias"[{key!r}] must be a number from '
                             "-100 to 100.")


def parse_rerank(body: bytes) -> OpenAIRequest:
    """A rerank body, Jina's and Cohere's shape as vLLM serves it: ``{"model", "query",
    "documents": [str or {"text"}], "top_n", "return_documents"}``; the documents travel as
    ``texts``, the rest as ``options`` (``top_n`` 0 or absent: every document, as vLLM's;
    ``return_documents`` true unless false, as Jina's).

    :raises FieldError: a field is missing, of the wrong type or out of range.
    """
    doc = _document(body)
    query = doc.get("query")
    if not isinstance(query, str) or not query.strip():
        raise FieldError("query", '"query" is required: the text to rank the documents by.',
                         "missing_required_parameter")
    documents = doc.get("documents")
    if not isinstance(documents, list) or not documents:
        raise FieldError("documents", '"documents" is required: a list of strings or of '
                         '{"text": "..."}.', "missing_required_parameter")
    texts = []
    for i, document in enumerate(documents):
        if isinstance(document, dict):
            document = document.get("text")
        if not isinstance(document, str):
            raise FieldError(f"documents[{i}]", f'documents[{i}] must be a string or '
                             '{"text": "..."}.', "invalid_type")
        texts.append(document)
    _characters(len(query) * len(texts) + sum(map(len, texts)), "documents")
    top_n = doc.get("top_n", 0)
    if not _integer_in(top_n, 0, 1 << 31):
        raise FieldError("top_n", '"top_n" must be a whole number: how many of the best '
                         "documents to answer (0: all).")
    _boolean(doc, "return_documents")
    return OpenAIRequest(RERANK, doc["model"], texts=texts, options={
        "query": query, "top_n": top_n, "return_documents": doc.get("return_documents", True)})


def _embedding_options(doc: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    encoding = doc.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise FieldError("encoding_format", '"encoding_format" must be "float" or "base64".')
    if encoding != "float":
        options["encoding_format"] = encoding
    dimensions = doc.get("dimensions")
    if dimensions is not None:
        if not _integer_in(dimensions, 1, 1 << 20):
            raise FieldError("dimensions", '"dimensions" must be a positive integer: the '
                             "length to shorten each embedding to.")
        options["dimensions"] = dimensions
    return options


# -- values ---------------------------------------------------------------------------------

def _characters(count: int, param: str = "messages") -> None:
    if count > MAX_PROMPT_CHARACTERS:
        raise FieldError(param, f"The prompt has {count} characters; at most "
                         f"{MAX_PROMPT_CHARACTERS} are served (and the model's context is far "
                         "less).")


def _length(value: Any) -> int:
    """The characters of every string in ``value`` (keys included): what a template may render."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(k)) + _length(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_length(v) for v in value)
    return 0


def _list(where: str, value: Any, what: str = "a list") -> list[Any]:
    if not isinstance(value, list):
        raise FieldError(where, f"{where} must be {what}.", "invalid_type")
    return value


def _boolean(doc: dict[str, Any], key: str) -> None:
    if key in doc and not isinstance(doc[key], bool):
        raise FieldError(key, f'"{key}" must be true or false.', "invalid_type")


def _integer_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _number(doc: dict[str, Any], key: str, low: float, high: float) -> None:
    value = doc.get(key)
    if value is None:
        return
    # JSON's numbers are int and float (a bool is an int to Python, not a number to JSON)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise FieldError(key, f'"{key}" must be a number from {low:g} to {high:g}.')
