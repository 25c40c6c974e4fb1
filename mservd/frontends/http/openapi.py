"""The OpenAPI 3.0 descriptions served at ``OPTIONS /`` and ``GET /api-description``.

This module owns the two documents as plain data: :func:`inference_api` describes exactly the
routes of the inference address (``mservd/frontends/http/inference.py``, and the Open Inference
Protocol v2 routes of ``v2.py`` when that module is installed) and :func:`management_api`
those of the management address (``management.py``). It must not import Flask, the bridge or
anything that does IO: the frontends serve what it returns. When a route, parameter or answer
changes there, change it here too; ``tests/integration/test_openapi.py`` fuzzes the served
documents against the daemon and fails on any answer they do not describe.

As in TorchServe, the descriptions themselves need no token.
"""

from __future__ import annotations

from typing import Any

from mservd import __version__

OPENAPI_VERSION = "3.0.3"

_ERROR = {"$ref": "#/components/schemas/Error"}
_V2_ERROR = {"$ref": "#/components/schemas/V2Error"}
_STATUS = {"$ref": "#/components/schemas/Status"}
_NO_TOKEN: list[dict[str, list[str]]] = []  # an operation that needs no bearer token

_ERROR_WHY = {
    400: "A missing or malformed parameter, header or body.",
    401: "Token authorization failed: no bearer token, a wrong key, or an expired one.",
    403: "The operation is refused, e.g. removing the default version while others remain.",
    404: "The model, version or archive does not exist.",
    405: "The method is not allowed on this route, or model registration is disabled.",
    409: "The model version is already registered.",
    413: "The request body exceeds max_request_size.",
    500: "A handler raised, a worker died, or the model's workers failed to start.",
    503: "No live worker, the model's queue is full (with Retry-After), the daemon is "
         "stopping, or a stateful model has as many sequences open as it allows, or this "
         "sequence as many requests queued.",
    504: "The request's deadline passed before a worker took it.",
    507: "The worker ran out of memory.",
}


def _json(description: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}},
            **extra}


def _errors(*codes: int, schema: dict[str, Any] = _ERROR) -> dict[str, Any]:
    return {str(code): _json(_ERROR_WHY[code], schema) for code in codes}


# Answered by the HTTP server before the route is known, for every route.
_HTTP_LIMITS = {
    "414": _json("The request URL exceeds 8192 bytes.", _ERROR),
    "431": _json("The request headers exceed 65536 bytes in all.", _ERROR),
}


def _with_http_limits(paths: dict[str, Any]) -> dict[str, Any]:
    for item in paths.values():
        for op in item.values():
            op["responses"].update({k: v for k, v in _HTTP_LIMITS.items()
                                    if k not in op["responses"]})
    return paths


def _query(name: str, description: str, schema: dict[str, Any],
           required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "description": description,
            "schema": schema}


def _path(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string", "minLength": 1}}


def _document(title: str, description: str, paths: dict[str, Any],
              schemas: dict[str, Any]) -> dict[str, Any]:
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": title, "description": description, "version": __version__},
        "security": [{"bearer": []}],
        "paths": _with_http_limits(paths),
        "components": {
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "A key from key_file.json, written by the daemon at start.",
            }},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["code", "type", "message"],
                    "properties": {
                        "code": {"type": "integer", "description": "The HTTP status."},
                        "type": {"type": "string", "example": "ModelNotFoundException"},
                        "message": {"type": "string"},
                    },
                },
                "Status": {
                    "type": "object",
                    "required": ["status"],
                    "properties": {"status": {"type": "string"}},
                },
                **schemas,
            },
        },
    }


def _description_paths() -> dict[str, Any]:
    answer = {"200": _json("This OpenAPI 3 document.", {"type": "object"})}
    return {
        "/": {"options": {
            "operationId": "apiDescription", "summary": "This API's OpenAPI 3 description.",
            "security": _NO_TOKEN, "responses": answer,
        }},
        "/api-description": {"get": {
            "operationId": "getApiDescription",
            "summary": "This API's OpenAPI 3 description.",
            "security": _NO_TOKEN, "responses": {**answer, **_errors(405)},
        }},
    }


# -- inference ---------------------------------------------------------------------------


def _prediction(operation_id: str, summary: str, versioned: bool, explain: bool) -> dict:
    parameters = [_path("model_name", "The model's name.")]
    if versioned:
        parameters.append(_path("model_version", "The model version, e.g. 1.0."))
    parameters.append({
        "name": "X-Request-Timeout-Ms", "in": "header", "required": False,
        "description": "The longest the request may wait in the queue, in milliseconds; past "
                       "it the answer is 504.",
        "schema": {"type": "number", "minimum": 0},
    })
    parameters.append({
        "name": "ts_request_sequence_id", "in": "header", "required": False,
        "description": "A stateful model's sequence this request belongs to (sequenceBatching):"
                       " its requests run in order on one worker. Without it a stateful model "
                       "opens a new sequence; the answer's header of the same name says which.",
        "schema": {"type": "string", "minLength": 1, "maxLength": 256},
    })
    parameters.append({
        "name": "ts_request_sequence_end", "in": "header", "required": False,
        "description": "`true`: this request is its sequence's last.",
        "schema": {"type": "string", "enum": ["true", "false"]},
    })
    any_content = {"schema": {}}
    return {
        "operationId": operation_id,
        "summary": summary,
        "description": (
            "The body reaches the handler as one input named `body` (JSON parsed, text/* as "
            "str, anything else as bytes), or one input per field of a multipart/form-data or "
            "urlencoded form (a file part with its content type, a plain field as bytes). The "
            "answer is the handler's output: bytes as they are, str as UTF-8, anything else as "
            "JSON; the handler may set the status, content type and headers. A path past the "
            "version (`.../{model_version}/v1/chat/completion`) reaches the handler as the "
            "request header `url_path`, as in TorchServe."
            + (" The handler sees the header `explain: True`." if explain else "")),
        "parameters": parameters,
        "requestBody": {"required": False, "content": {
            "application/json": {"schema": {}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "text/plain": {"schema": {"type": "string"}},
            "multipart/form-data": {"schema": {
                "type": "object",
                "additionalProperties": {"type": "string", "format": "binary"}}},
            "application/x-www-form-urlencoded": {"schema": {
                "type": "object", "additionalProperties": {"type": "string"}}},
        }},
        "responses": {
            "200": {
                "description": "The handler's output for this request.",
                "headers": {"x-request-id": {"description": "The request's id (a UUID).",
                                             "schema": {"type": "string"}}},
                "content": {"*/*": any_content},
            },
            **_errors(400, 401, 404, 405, 413, 500, 503, 504, 507),
            "default": {"description": "A status the handler set for this request.",
                        "content": {"*/*": any_content}},
        },
    }


def _inference_paths() -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/ping": {"get": {
            "operationId": "ping", "summary": "The daemon's health.",
            "security": _NO_TOKEN,
            "responses": {
                "200": _json("Healthy: every model's default version has its minWorkers live.",
                             {"$ref": "#/components/schemas/Health"}),
                "500": _json("Unhealthy: a model has fewer live workers than minWorkers, or a "
                             "start-up model is still loading.",
                             {"$ref": "#/components/schemas/Health"}),
                **_errors(405, 503),
            },
        }},
    }
    for kind, explain in (("predictions", False), ("explanations", True)):
        for versioned in (False, True):
            path = f"/{kind}/{{model_name}}" + ("/{model_version}" if versioned else "")
            op = kind[:-1] + ("Version" if versioned else "")
            summary = ("An explanation" if explain else "A prediction") + " from the model's " + (
                "version." if versioned else "default version.")
            post = _prediction(f"{op}Post", summary, versioned, explain)
            put = {**_prediction(f"{op}Put", summary, versioned, explain),
                   "summary": summary + " Same as POST."}
            get = {key: value for key, value in
                   _prediction(f"{op}Get", summary, versioned, explain).items()
                   if key != "requestBody"}
            get["summary"] = summary + " With no body, as TorchServe takes it."
            paths[path] = {"post": post, "put": put, "get": get}
    return paths


def _v2_paths() -> dict[str, Any]:
    """The Open Inference Protocol v2 routes of ``mservd/frontends/http/v2.py``."""
    meta = {"$ref": "#/components/schemas/V2ModelMetadata"}
    ready = {"$ref": "#/components/schemas/V2ModelReady"}
    header = {
        "name": "Inference-Header-Content-Length", "in": "header", "required": False,
        "description": "With the binary tensor extension: the length in bytes of the JSON "
                       "header that starts the body; binary tensors follow it in order.",
        "schema": {"type": "integer", "minimum": 0},
    }

    def model_params(versioned: bool) -> list[dict[str, Any]]:
        params = [_path("model_name", "The model's name.")]
        if versioned:
            params.append(_path("model_version", "The model version."))
        return params

    paths: dict[str, Any] = {
        "/v2": {"get": {
            "operationId": "v2ServerMetadata", "summary": "Server metadata.",
            "security": _NO_TOKEN,
            "responses": {"200": _json("Name, version and extensions.",
                                       {"$ref": "#/components/schemas/V2ServerMetadata"}),
                          **_errors(405, schema=_V2_ERROR)},
        }},
        "/v2/health/live": {"get": {
            "operationId": "v2ServerLive", "summary": "200 while the daemon answers.",
            "security": _NO_TOKEN,
            "responses": {"200": _json("Live.", {"type": "object", "required": ["live"],
                                                 "properties": {"live": {"type": "boolean"}}}),
                          **_errors(405, 503, schema=_V2_ERROR)},
        }},
        "/v2/health/ready": {"get": {
            "operationId": "v2ServerReady",
            "summary": "200 when the start-up models have live workers, else 503.",
            "security": _NO_TOKEN,
            "responses": {
                "200": _json("Ready.", {"$ref": "#/components/schemas/V2Ready"}),
                "503": _json("Not ready, or the daemon does not answer.", {"oneOf": [
                    {"$ref": "#/components/schemas/V2Ready"}, _V2_ERROR]}),
                **_errors(405, schema=_V2_ERROR)},
        }},
    }
    for versioned in (False, True):
        base = "/v2/models/{model_name}" + ("/versions/{model_version}" if versioned else "")
        suffix = "Version" if versioned else ""
        paths[base] = {"get": {
            "operationId": f"v2ModelMetadata{suffix}", "summary": "Model metadata.",
            "parameters": model_params(versioned),
            "responses": {"200": _json("Name, versions, platform and declared tensors.", meta),
                          **_errors(400, 401, 404, 405, 503, schema=_V2_ERROR)},
        }}
        paths[base + "/ready"] = {"get": {
            "operationId": f"v2ModelReady{suffix}",
            "summary": "200 when a worker of the model version is live, else 503.",
            "parameters": model_params(versioned),
            "responses": {"200": _json("Ready.", ready),
                          "503": _json("Not ready, or the daemon does not answer.", {
                              "oneOf": [ready, _V2_ERROR]}),
                          **_errors(400, 401, 404, 405, schema=_V2_ERROR)},
        }}
        paths[base + "/infer"] = {"post": {
            "operationId": f"v2ModelInfer{suffix}", "summary": "Inference.",
            "parameters": [*model_params(versioned), header],
            "requestBody": {
                "required": True,
                "description": "JSON tensors, or with the binary tensor extension the JSON "
                               "header (Inference-Header-Content-Length bytes), then the "
                               "binary tensors in order.",
                "content": {
                    "application/json": {"schema": {
                        "$ref": "#/components/schemas/V2InferRequest"}},
                    "application/octet-stream": {
                        "schema": {"type": "string", "format": "binary"}},
                }},
            "responses": {
                "200": {
                    "description": "The outputs: JSON, or a JSON header and binary tensors when "
                                   "binary outputs were asked for.",
                    "headers": {
                        "x-request-id": {"schema": {"type": "string"}},
                        "Inference-Header-Content-Length": {
                            "description": "Present with binary outputs.",
                            "schema": {"type": "integer"}},
                    },
                    "content": {
                        "application/json": {"schema": {
                            "$ref": "#/components/schemas/V2InferResponse"}},
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}},
                    },
                },
                **_errors(400, 401, 404, 405, 413, 500, 503, 504, 507, schema=_V2_ERROR),
            },
        }}
    return paths


_DATATYPE = {"type": "string", "enum": [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
    "FP32", "FP64", "BF16", "BYTES"]}
_SHAPE = {"type": "array", "items": {"type": "integer"}}
_TENSOR_SPEC = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
    "name": {"type": "string"}, "datatype": {"type": "string"}, "shape": _SHAPE}}

_V2_SCHEMAS: dict[str, Any] = {
    "V2Error": {"type": "object", "required": ["error"],
                "properties": {"error": {"type": "string"}}},
    "V2ServerMetadata": {"type": "object", "required": ["name", "version", "extensions"],
                         "properties": {"name": {"type": "string"},
                                        "version": {"type": "string"},
                                        "extensions": {"type": "array",
                                                       "items": {"type": "string"}}}},
    "V2Ready": {"type": "object", "required": ["ready"],
                "properties": {"ready": {"type": "boolean"}}},
    "V2ModelReady": {"type": "object", "required": ["name", "version", "ready"],
                     "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                                    "ready": {"type": "boolean"}}},
    "V2ModelMetadata": {"type": "object",
                        "required": ["name", "versions", "platform", "inputs", "outputs"],
                        "properties": {"name": {"type": "string"},
                                       "versions": {"type": "array",
                                                    "items": {"type": "string"}},
                                       "platform": {"type": "string"},
                                       "inputs": {"type": "array", "items": _TENSOR_SPEC},
                                       "outputs": {"type": "array", "items": _TENSOR_SPEC}}},
    "V2InferRequest": {"type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"},
        "parameters": {"type": "object"},
        "inputs": {"type": "array", "items": {
            "type": "object", "required": ["name", "shape", "datatype"], "properties": {
                "name": {"type": "string"}, "shape": _SHAPE, "datatype": _DATATYPE,
                "parameters": {"type": "object"}, "data": {}}}},
        "outputs": {"type": "array", "items": {
            "type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "parameters": {"type": "object"}}}},
    }},
    "V2InferResponse": {"type": "object", "required": ["model_name", "outputs"], "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "id": {"type": "string"},
        "parameters": {"type": "object"},
        "outputs": {"type": "array", "items": {
            "type": "object", "required": ["name", "shape", "datatype"], "properties": {
                "name": {"type": "string"}, "shape": _SHAPE, "datatype": {"type": "string"},
                "parameters": {"type": "object"}, "data": {}}}},
    }},
}


def _kserve_v1_paths() -> dict[str, Any]:
    """KServe's V1 routes of ``mservd/frontends/http/kserve_v1.py``."""
    name = [_path("model_name", "The model's name.")]
    ready = {"type": "object", "required": ["name", "ready"],
             "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}}
    return {
        "/v1/models": {"get": {
            "operationId": "v1ListModels", "summary": "The registered models' names.",
            "responses": {"200": _json("Names.", {
                "type": "object", "required": ["models"],
                "properties": {"models": {"type": "array", "items": {"type": "string"}}}}),
                **_errors(400, 401, 405, 503, schema=_V2_ERROR)},
        }},
        "/v1/models/{model_name}": {"get": {
            "operationId": "v1ModelReady",
            "summary": "Whether the model's default version has a live worker (503 if not).",
            "parameters": name,
            "responses": {"200": _json("Ready.", ready),
                          "503": _json("Not ready, or the daemon does not answer.", {
                              "oneOf": [ready, _V2_ERROR]}),
                          **_errors(400, 401, 404, 405, schema=_V2_ERROR)},
        }},
        "/v1/models/{model_name}:predict": {"post": {
            "operationId": "v1Predict",
            "summary": "One prediction per instance, each instance a row of the batch.",
            "parameters": name,
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["instances"],
                "properties": {"instances": {"type": "array", "minItems": 1}}}}}},
            "responses": {"200": _json("The predictions, in instance order.", {
                "type": "object", "required": ["predictions"],
                "properties": {"predictions": {"type": "array"}}}),
                **_errors(400, 401, 404, 405, 413, 500, 503, 504, 507, schema=_V2_ERROR)},
        }},
    }


_OPENAI_ERROR = {"$ref": "#/components/schemas/OpenAIError"}

_GENERATION_FIELDS: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "seed": {"type": "integer"},
    "stop": {"oneOf": [{"type": "string"},
                       {"type": "array", "maxItems": 4, "items": {"type": "string"}}]},
    "n": {"type": "integer", "enum": [1]},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object",
                       "properties": {"include_usage": {"type": "boolean"}}},
    "ignore_eos": {"type": "boolean", "description": "Generate max_tokens, past EOS."},
}

# One server-sent event, as a client parses it: its data is the chunk's JSON (or [DONE]).
_EVENT = {"type": "object", "properties": {"data": {"type": "string"},
                                           "event": {"type": "string"}}}

_OPENAI_SCHEMAS: dict[str, Any] = {
    "OpenAIError": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": "string", "nullable": True},
            "code": {"type": "string", "nullable": True}}}}},
    "ChatCompletionRequest": {"type": "object", "required": ["model", "messages"],
                              "properties": {**_GENERATION_FIELDS, "messages": {
                                  "type": "array", "minItems": 1, "items": {
                                      "type": "object", "required": ["role", "content"],
                                      "properties": {"role": {"type": "string"},
                                                     "content": {"type": "string"}}}}}},
    "CompletionRequest": {"type": "object", "required": ["model", "prompt"],
                          "properties": {**_GENERATION_FIELDS, "prompt": {"type": "string"}}},
    "EmbeddingRequest": {"type": "object", "required": ["model", "input"], "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {"oneOf": [{"type": "string"},
                            {"type": "array", "items": {"type": "string"}}]}}},
    "GenerateRequest": {"type": "object", "required": ["text_input"], "properties": {
        "text_input": {"type": "string"},
        "parameters": {"type": "object", "properties": {
            key: _GENERATION_FIELDS[key] for key in ("max_tokens", "temperature", "top_p",
                                                     "seed", "stop", "ignore_eos")}}}},
    "GenerateResponse": {"type": "object", "required": ["model_name", "text_output"],
                         "properties": {"model_name": {"type": "string"},
                                        "model_version": {"type": "string"},
                                        "text_output": {"type": "string"}}},
}


def _openai_paths() -> dict[str, Any]:
    """OpenAI's routes of ``mservd/frontends/http/openai.py``, also under ``/openai``."""
    def generation(op_id: str, summary: str, request: str, answer: str) -> dict[str, Any]:
        return {"post": {
            "operationId": op_id, "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{request}"}}}},
            "responses": {
                "200": {"description": f"{answer}; with \"stream\": true, server-sent events "
                                       "(one chunk each) ending with data: [DONE].",
                        "content": {"application/json": {"schema": {"type": "object"}},
                                    "text/event-stream": {"schema": _EVENT}}},
                **_errors(400, 401, 404, 405, 413, 500, 503, 504, 507, schema=_OPENAI_ERROR)},
        }}

    paths = {
        "/v1/chat/completions": generation(
            "chatCompletions", "Chat: the messages through the model's chat template.",
            "ChatCompletionRequest", "A chat.completion"),
        "/v1/completions": generation(
            "completions", "Text completion of a prompt.", "CompletionRequest",
            "A text_completion"),
        "/v1/embeddings": {"post": {
            "operationId": "embeddings", "summary": "One vector per input text.",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/EmbeddingRequest"}}}},
            "responses": {
                "200": _json("A list of embeddings.", {"type": "object"}),
                **_errors(400, 401, 404, 405, 413, 500, 503, 504, 507, schema=_OPENAI_ERROR)},
        }},
    }
    for path, item in list(paths.items()):
        paths["/openai" + path] = {method: {**op, "operationId": "openai" + op["operationId"]}
                                   for method, op in item.items()}
    return paths


def _generate_paths() -> dict[str, Any]:
    """Triton's generate extension, in ``mservd/frontends/http/v2.py``."""
    paths: dict[str, Any] = {}
    for versioned in (False, True):
        params = [_path("model_name", "The model's name.")]
        prefix = "/v2/models/{model_name}"
        if versioned:
            params.append(_path("model_version", "The model version."))
            prefix += "/versions/{model_version}"
        for rest, answer in (("generate", ("application/json", {
                "$ref": "#/components/schemas/GenerateResponse"})),
                             ("generate_stream", ("text/event-stream", _EVENT))):
            op_id = "v2" + rest.title().replace("_", "") + ("Version" if versioned else "")
            paths[f"{prefix}/{rest}"] = {"post": {
                "operationId": op_id,
                "summary": "The whole generated text." if rest == "generate" else
                           "The generated text as server-sent events, a part each.",
                "parameters": params,
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/GenerateRequest"}}}},
                "responses": {
                    "200": {"description": "The answer.",
                            "content": {answer[0]: {"schema": answer[1]}}},
                    **_errors(400, 401, 404, 405, 413, 500, 503, 504, 507, schema=_V2_ERROR)},
            }}
    return paths


def inference_api() -> dict[str, Any]:
    """The OpenAPI 3 document of the inference address."""
    paths = {**_description_paths(), **_inference_paths()}
    schemas: dict[str, Any] = {"Health": {
        "type": "object", "required": ["status"],
        "properties": {"status": {"type": "string", "enum": ["Healthy", "Unhealthy"]}}}}
    description = ("TorchServe's inference API: predictions and explanations from the "
                   "registered models, and health. Errors are {code, type, message}; KServe's "
                   "V1 routes (/v1/models...) answer errors as {error}.")
    paths.update(_kserve_v1_paths())
    paths.update(_v2_paths())
    paths.update(_generate_paths())
    paths.update(_openai_paths())
    schemas.update(_V2_SCHEMAS)
    schemas.update(_OPENAI_SCHEMAS)
    description += (" The Open Inference Protocol v2 routes (/v2/...) answer errors as {error};"
                    " OpenAI's (/v1/chat/completions, /v1/completions, /v1/embeddings, also "
                    "under /openai) as {error: {message, type, param, code}}.")
    return _document("mservd inference API", description, paths, schemas)


# -- management --------------------------------------------------------------------------

_BOOL = {"type": "string", "enum": ["true", "false"]}
_INT = {"type": "integer"}


def _model_params(versioned: bool, version_doc: str = "The model version.") -> list[dict]:
    params = [_path("model_name", "The model's name.")]
    if versioned:
        params.append(_path("model_version", version_doc))
    return params


def _management_paths() -> dict[str, Any]:
    describe_list = {"type": "array", "items": {"$ref": "#/components/schemas/ModelDescription"}}
    paths: dict[str, Any] = {
        "/models": {
            "post": {
                "operationId": "registerModel",
                "summary": "Register an archive (needs --enable-model-api).",
                "parameters": [
                    _query("url", "The archive: a file or folder in the model store (no '..'), "
                                  "or an http(s) URL matching allowed_urls.",
                           {"type": "string"}, required=True),
                    _query("model_name", "Register under this name instead of the archive's.",
                           {"type": "string"}),
                    _query("handler", "Use this handler instead of the archive's.",
                           {"type": "string"}),
                    _query("batch_size", "Requests per batch.", _INT),
                    _query("max_batch_delay", "Milliseconds to wait to fill a batch.", _INT),
                    _query("initial_workers", "Workers to start.", _INT),
                    _query("synchronous", "Wait until the initial workers are ready (default "
                                          "true).", _BOOL),
                    _query("response_timeout", "Seconds a batch may take.", _INT),
                    _query("startup_timeout", "Seconds a worker may take to load.", _INT),
                ],
                "responses": {
                    "200": _json("Registered, with its initial workers ready (or none asked).",
                                 _STATUS),
                    "202": _json("Registered; the workers are starting.", _STATUS),
                    **_errors(400, 401, 404, 405, 409, 500, 503),
                },
            },
            "get": {
                "operationId": "listModels", "summary": "The registered models, by name.",
                "parameters": [
                    _query("limit", "Models per page (default 100).", _INT),
                    _query("next_page_token", "The nextPageToken of the previous page.",
                           {"type": "string"}),
                ],
                "responses": {
                    "200": _json("One page of models.",
                                 {"$ref": "#/components/schemas/ModelList"}),
                    **_errors(400, 401, 503),
                },
            },
        },
    }
    scale_params = [
        _query("min_worker", "Workers to run (default 1).", _INT),
        _query("max_worker", "The most workers (at least min_worker).", _INT),
        _query("synchronous", "Wait until the workers are ready (default false).", _BOOL),
    ]
    for versioned in (False, True):
        path = "/models/{model_name}" + ("/{model_version}" if versioned else "")
        suffix = "Version" if versioned else ""
        paths[path] = {
            "get": {
                "operationId": f"describeModel{suffix}",
                "summary": "Describe the model's default version" + (
                    ", one version, or every version ('all')." if versioned else "."),
                "parameters": [
                    *_model_params(versioned, "A version, or 'all'."),
                    _query("customized", "Ask the version's handler for its own metadata (its "
                                         "describe_handle()), shown as customizedMetadata; "
                                         "not with 'all'.", _BOOL),
                ],
                "responses": {"200": _json("One description per version.", describe_list),
                              **_errors(400, 401, 404, 500, 503, 504)},
            },
            "put": {
                "operationId": f"scaleModel{suffix}",
                "summary": "Scale the worker pool of the " + (
                    "version." if versioned else "default version."),
                "parameters": [*_model_params(versioned), *scale_params],
                "responses": {
                    "200": _json("Scaled (synchronous=true).", _STATUS),
                    "202": _json("Processing worker updates...", _STATUS),
                    **_errors(400, 401, 404, 500, 503),
                },
            },
            "delete": {
                "operationId": f"unregisterModel{suffix}",
                "summary": "Unregister the " + ("version" if versioned else "default version")
                           + " and stop its workers (needs --enable-model-api).",
                "parameters": _model_params(versioned),
                "responses": {"200": _json("Unregistered.", _STATUS),
                              **_errors(400, 401, 403, 404, 405, 503)},
            },
        }
    paths["/models/{model_name}/{model_version}/set-default"] = {"put": {
        "operationId": "setDefaultVersion",
        "summary": "Make the version the model's default.",
        "parameters": _model_params(True),
        "responses": {"200": _json("Default version updated.", _STATUS),
                      **_errors(400, 401, 404, 503)},
    }}
    paths["/token"] = {"get": {
        "operationId": "rotateKey",
        "summary": "Replace the inference or management key; authorize with the API key.",
        "parameters": [_query("type", "Which key to replace.",
                              {"type": "string", "enum": ["inference", "management"]})],
        "responses": {
            "200": _json("The new key.", {"type": "object", "required": ["type", "key"],
                                          "properties": {"type": {"type": "string"},
                                                         "key": {"type": "string"}}}),
            **_errors(400, 401, 503),
        },
    }}
    return paths


_WORKER = {"type": "object",
           "required": ["id", "startTime", "status", "memoryUsage", "pid", "gpu", "gpuUsage"],
           "properties": {
               "id": {"type": "string"},
               "startTime": {"type": "string"},
               "status": {"type": "string",
                          "enum": ["STARTING", "READY", "BUSY", "STOPPING"]},
               "memoryUsage": {"type": "integer", "description": "Resident bytes."},
               "pid": {"type": "integer"},
               "gpu": {"type": "boolean"},
               "gpuUsage": {"type": "string", "example": "gpuId::0"},
           }}

_MANAGEMENT_SCHEMAS: dict[str, Any] = {
    "ModelList": {"type": "object", "required": ["models"], "properties": {
        "nextPageToken": {"type": "string", "description": "Absent on the last page."},
        "models": {"type": "array", "items": {
            "type": "object", "required": ["modelName", "modelUrl"],
            "properties": {"modelName": {"type": "string"}, "modelUrl": {"type": "string"}}}},
    }},
    "ModelDescription": {
        "type": "object",
        "required": ["modelName", "modelVersion", "modelUrl", "runtime", "minWorkers",
                     "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout",
                     "startupTimeout", "loadedAtStartup", "isDefault", "workers",
                     "jobQueueStatus"],
        "properties": {
            "modelName": {"type": "string"},
            "modelVersion": {"type": "string"},
            "modelUrl": {"type": "string"},
            "runtime": {"type": "string"},
            "minWorkers": {"type": "integer"},
            "maxWorkers": {"type": "integer"},
            "batchSize": {"type": "integer"},
            "maxBatchDelay": {"type": "integer"},
            "responseTimeout": {"type": "number"},
            "startupTimeout": {"type": "number"},
            "loadedAtStartup": {"type": "boolean"},
            "isDefault": {"type": "boolean"},
            "loadError": {"type": "string", "description": "Why the workers failed to load."},
            "customizedMetadata": {"description": "What the handler's describe_handle() "
                                                  "returned (customized=true)."},
            "workers": {"type": "array", "items": _WORKER},
            "jobQueueStatus": {"type": "object",
                               "required": ["remainingCapacity", "pendingRequests"],
                               "properties": {"remainingCapacity": {"type": "integer"},
                                              "pendingRequests": {"type": "integer"}}},
        },
    },
}


def management_api() -> dict[str, Any]:
    """The OpenAPI 3 document of the management address."""
    return _document(
        "mservd management API",
        "TorchServe's management API: register, describe, scale, version and unregister "
        "models, and rotate keys. Errors are {code, type, message}.",
        {**_description_paths(), **_management_paths()}, dict(_MANAGEMENT_SCHEMAS))


__all__ = ["inference_api", "management_api"]
