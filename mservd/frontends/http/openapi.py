"""The OpenAPI 3.0 documents served at ``OPTIONS /`` and ``GET /api-description`` (as in
TorchServe, without a token): what ``routes.py`` declares of each route, written as a document.

This module owns the documents' vocabulary (answers, parameters, the error shapes and the
schemas the answers and bodies take) and :func:`document`, which writes a port's routes as one
document; the routes themselves, and what each operation says, are declared in ``routes.py``,
once, beside the handlers that answer them. It does no IO and imports no handler.
``tests/integration/test_openapi.py`` fuzzes the served documents against the daemon and fails
on any answer they do not describe.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mservd import __version__
from mservd.frontends.http.router import Operation, Route

OPENAPI_VERSION = "3.0.3"

ERROR = {"$ref": "#/components/schemas/Error"}
V2_ERROR = {"$ref": "#/components/schemas/V2Error"}
OPENAI_ERROR = {"$ref": "#/components/schemas/OpenAIError"}
STATUS = {"$ref": "#/components/schemas/Status"}
BOOL = {"type": "string", "enum": ["true", "false"]}
INT = {"type": "integer"}
# One server-sent event, as a client parses it: its data is the chunk's JSON (or [DONE]).
EVENT = {"type": "object", "properties": {"data": {"type": "string"},
                                          "event": {"type": "string"}}}

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


def json_answer(description: str, schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An answer whose body is JSON of ``schema``."""
    return {"description": description, "content": {"application/json": {"schema": schema}},
            **extra}


def errors(*codes: int, schema: dict[str, Any] = ERROR) -> dict[str, Any]:
    """The error answers of ``codes``, each in the route's error ``schema``."""
    return {str(code): json_answer(_ERROR_WHY[code], schema) for code in codes}


# Answered by the HTTP server before the route is known, for every route.
_HTTP_LIMITS = {
    "414": json_answer("The request URL exceeds 8192 bytes.", ERROR),
    "431": json_answer("The request headers exceed 65536 bytes in all.", ERROR),
}


def query(name: str, description: str, schema: dict[str, Any],
          required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "description": description,
            "schema": schema}


def path_param(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string", "minLength": 1}}


def model_params(versioned: bool,
                 version_doc: str = "The model version.") -> list[dict[str, Any]]:
    """``model_name``, and ``model_version`` when the path has one."""
    params = [path_param("model_name", "The model's name.")]
    if versioned:
        params.append(path_param("model_version", version_doc))
    return params


def operation(op: Operation) -> dict[str, Any]:
    """``op`` as an OpenAPI operation object."""
    doc: dict[str, Any] = {"operationId": op.id, "summary": op.summary}
    if op.description is not None:
        doc["description"] = op.description
    if not op.token:
        doc["security"] = []  # no bearer token
    if op.parameters:
        doc["parameters"] = [dict(param) for param in op.parameters]
    if op.body is not None:
        doc["requestBody"] = dict(op.body)
    doc["responses"] = {**op.answers, **{status: answer for status, answer in _HTTP_LIMITS.items()
                                         if status not in op.answers}}
    return doc


def document(title: str, description: str, routes: Iterable[Route],
             schemas: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI 3 document of a port's ``routes`` (those with an operation), in the order
    they are declared."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if route.operation is not None:
            paths.setdefault(route.path, {})[route.method.lower()] = operation(route.operation)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": title, "description": description, "version": __version__},
        "security": [{"bearer": []}],
        "paths": paths,
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


# -- the schemas the answers and bodies take -------------------------------------------

HEALTH_SCHEMAS: dict[str, Any] = {"Health": {
    "type": "object", "required": ["status"],
    "properties": {"status": {"type": "string", "enum": ["Healthy", "Unhealthy"]}}}}

_DATATYPE = {"type": "string", "enum": [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
    "FP32", "FP64", "BF16", "BYTES"]}
_SHAPE = {"type": "array", "items": {"type": "integer"}}
_TENSOR_SPEC = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
    "name": {"type": "string"}, "datatype": {"type": "string"}, "shape": _SHAPE}}

V2_SCHEMAS: dict[str, Any] = {
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

_GENERATION_FIELDS: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "seed": {"type": "integer"},
    "stop": {"oneOf": [{"type": "string"},
                       {"type": "array", "maxItems": 4, "items": {"type": "string"}}]},
    "n": {"type": "integer", "minimum": 1, "maximum": 8,
          "description": "Choices of each prompt; at most 64 choices a request."},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object",
                       "properties": {"include_usage": {"type": "boolean"}}},
    "ignore_eos": {"type": "boolean", "description": "Generate max_tokens, past EOS."},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "logit_bias": {"type": "object", "maxProperties": 300,
                   "additionalProperties": {"type": "number", "minimum": -100,
                                            "maximum": 100}},
    "response_format": {"type": "object", "required": ["type"], "properties": {
        "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
        "json_schema": {"type": "object", "required": ["name", "schema"], "properties": {
            "name": {"type": "string"}, "schema": {"type": "object"},
            "strict": {"type": "boolean"}}}}},
}
_TEXT_PARTS = {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}}
_TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}

OPENAI_SCHEMAS: dict[str, Any] = {
    "OpenAIError": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": "string", "nullable": True},
            "code": {"type": "string", "nullable": True}}}}},
    "ChatCompletionRequest": {"type": "object", "required": ["model", "messages"],
                              "properties": {**_GENERATION_FIELDS, "messages": {
                                  "type": "array", "minItems": 1, "items": {
                                      "type": "object", "required": ["role", "content"],
                                      "properties": {
                                          "role": {"type": "string", "enum": [
                                              "system", "developer", "user", "assistant",
                                              "tool"]},
                                          "content": {"oneOf": [{"type": "string"},
                                                                _TEXT_PARTS]},
                                          "name": {"type": "string"}}}},
                                  "logprobs": {"type": "boolean"},
                                  "top_logprobs": {"type": "integer", "minimum": 0,
                                                   "maximum": 20}}},
    "CompletionRequest": {"type": "object", "required": ["model", "prompt"],
                          "properties": {**_GENERATION_FIELDS, "prompt": {"oneOf": [
                              {"type": "string"},
                              {"type": "array", "minItems": 1, "items": {"type": "string"}},
                              _TOKEN_IDS,
                              {"type": "array", "minItems": 1, "items": _TOKEN_IDS}]},
                              "logprobs": {"type": "integer", "minimum": 0, "maximum": 5}}},
    "EmbeddingRequest": {"type": "object", "required": ["model", "input"], "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {"oneOf": [{"type": "string"},
                            {"type": "array", "items": {"type": "string"}}]},
        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "minimum": 1}}},
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

MANAGEMENT_SCHEMAS: dict[str, Any] = {
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
            "workflowName": {"type": "string", "description": "The workflow this model is a "
                                                             "node of (its name is W__node)."},
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
