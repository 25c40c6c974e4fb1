"""Every HTTP route mservd serves, declared once: method, path, handler, and what the OpenAPI
document says of it (summary, parameters, request body, the answers it can give).

One table per API — :data:`INFERENCE` (TorchServe's, KServe V1, v2 and OpenAI's, on the
inference port), :data:`MANAGEMENT` (TorchServe's, a Flask app), :data:`DASHBOARD` (on the
management port too) and :data:`METRICS` — from which both what serves a request and the
documents served at ``OPTIONS /`` and ``GET /api-description`` (:func:`inference_api`,
:func:`management_api`) are made: the inference, dashboard and metrics ports dispatch through
their :class:`~.router.Router`, the management app registers each route as a Flask rule
(``management.create_management_app``). A route served but not described has no operation, and
says why.

A route's handler lives with its protocol (``inference.py``, ``kserve_v1.py``, ``v2.py``,
``openai.py``, ``management.py``, ``dashboard.py``, ``metrics.py``); this module only names it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from typing import Any, cast

from flask import Response, current_app

from mservd.frontends.http import (
    dashboard,
    inference,
    kserve_v1,
    management,
    metrics,
    openai,
    rerank,
    v2,
)
from mservd.frontends.http.dashboard import DashboardRoutes
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.openapi import (
    BOOL,
    EVENT,
    HEALTH_SCHEMAS,
    INT,
    MANAGEMENT_SCHEMAS,
    OPENAI_ERROR,
    OPENAI_SCHEMAS,
    STATUS,
    V2_ERROR,
    V2_SCHEMAS,
    document,
    errors,
    json_answer,
    model_params,
    path_param,
    query,
)
from mservd.frontends.http.request import OPENAI_PATHS, Answer, HttpRequest
from mservd.frontends.http.router import Operation, Params, Route, Router

# -- the API descriptions, on both ports ------------------------------------------------

_DESCRIBED = {"200": json_answer("This OpenAPI 3 document.", {"type": "object"})}
_DESCRIBE = "This API's OpenAPI 3 description."


def _descriptions(handler: Any) -> list[Route]:
    """``OPTIONS /`` and ``GET /api-description``: no token, as in TorchServe."""
    return [
        Route("OPTIONS", "/", handler, Operation("apiDescription", _DESCRIBE, _DESCRIBED,
                                                 token=False)),
        Route("GET", "/api-description", handler, Operation(
            "getApiDescription", _DESCRIBE, {**_DESCRIBED, **errors(405)}, token=False)),
    ]


@functools.cache
def _inference_api_json() -> bytes:
    return json.dumps(inference_api(), indent=2).encode()


async def _describe_inference(gateway: Gateway, request: HttpRequest,
                              params: Params) -> Answer:
    return Answer(200, _inference_api_json())


def _describe_management(call: management.Call) -> Response:
    # the app's response class (typed as werkzeug's base by Flask's JSON provider)
    return cast(Response, current_app.json.response(management_api()))


# -- TorchServe's inference API ----------------------------------------------------------

_PREDICTION_HEADERS = (
    {
        "name": "X-Request-Timeout-Ms", "in": "header", "required": False,
        "description": "The longest the request may wait in the queue, in milliseconds; past "
                       "it the answer is 504.",
        "schema": {"type": "number", "minimum": 0},
    },
    {
        "name": "ts_request_sequence_id", "in": "header", "required": False,
        "description": "A stateful model's sequence this request belongs to (sequenceBatching):"
                       " its requests run in order on one worker. Without it a stateful model "
                       "opens a new sequence; the answer's header of the same name says which.",
        "schema": {"type": "string", "minLength": 1, "maxLength": 256},
    },
    {
        "name": "ts_request_sequence_end", "in": "header", "required": False,
        "description": "`true`: this request is its sequence's last.",
        "schema": {"type": "string", "enum": ["true", "false"]},
    },
)
_ANY_CONTENT: dict[str, Any] = {"schema": {}}
_PREDICTION_BODY = {"required": False, "content": {
    "application/json": {"schema": {}},
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    "text/plain": {"schema": {"type": "string"}},
    "multipart/form-data": {"schema": {
        "type": "object",
        "additionalProperties": {"type": "string", "format": "binary"}}},
    "application/x-www-form-urlencoded": {"schema": {
        "type": "object", "additionalProperties": {"type": "string"}}},
}}
_PREDICTION_ANSWERS = {
    "200": {
        "description": "The handler's output for this request.",
        "headers": {"x-request-id": {"description": "The request's id (a UUID).",
                                     "schema": {"type": "string"}}},
        "content": {"*/*": _ANY_CONTENT},
    },
    **errors(400, 401, 404, 405, 413, 500, 503, 504, 507),
    "default": {"description": "A status the handler set for this request.",
                "content": {"*/*": _ANY_CONTENT}},
}


def _predictions() -> list[Route]:
    """``/predictions`` and ``/explanations``, each in POST, PUT and GET (a GET has no body,
    as TorchServe takes it), with and without a version. A version may be an empty segment (the
    default version), and a path past it reaches the handler as ``url_path``: both as in
    TorchServe, and neither described."""
    routes: list[Route] = []
    for kind, handler in (("predictions", inference.predict),
                          ("explanations", inference.explain)):
        explain = kind == "explanations"
        description = (
            "The body reaches the handler as one input named `body` (JSON parsed, text/* as "
            "str, anything else as bytes), or one input per field of a multipart/form-data or "
            "urlencoded form (a file part with its content type, a plain field as bytes). The "
            "answer is the handler's output: bytes as they are, str as UTF-8, anything else as "
            "JSON; the handler may set the status, content type and headers. A path past the "
            "version (`.../{model_version}/v1/chat/completion`) reaches the handler as the "
            "request header `url_path`, as in TorchServe."
            + (" The handler sees the header `explain: True`." if explain else ""))
        for versioned in (False, True):
            path = f"/{kind}/{{model_name}}" + ("/{model_version}" if versioned else "")
            op = kind[:-1] + ("Version" if versioned else "")
            summary = ("An explanation" if explain else "A prediction") + " from the model's " + (
                "version." if versioned else "default version.")
            parameters = [*model_params(versioned, "The model version, e.g. 1.0."),
                          *_PREDICTION_HEADERS]
            rest = "url_path" if versioned else None
            for method, suffix, body, said in (
                    ("POST", "Post", _PREDICTION_BODY, summary),
                    ("PUT", "Put", _PREDICTION_BODY, summary + " Same as POST."),
                    ("GET", "Get", None, summary + " With no body, as TorchServe takes it.")):
                routes.append(Route(method, path, handler, Operation(
                    f"{op}{suffix}", said, _PREDICTION_ANSWERS, parameters, body, description),
                    rest=rest, blank=("model_version",)))
    return routes


_TORCHSERVE = [
    *_descriptions(_describe_inference),
    Route("GET", "/ping", inference.ping, Operation(
        "ping", "The daemon's health.", token=False, answers={
            "200": json_answer("Healthy: every model's default version has its minWorkers "
                               "live.", {"$ref": "#/components/schemas/Health"}),
            "500": json_answer("Unhealthy: a model has fewer live workers than minWorkers, or "
                               "a start-up model is still loading.",
                               {"$ref": "#/components/schemas/Health"}),
            **errors(405, 503),
        })),
    *_predictions(),
    Route("POST", "/wfpredict/{workflow_name}", inference.workflow_predict, Operation(
        "workflowPredict", "A prediction of a workflow: its graph of models and functions.",
        {"200": {"description": "The leaf node's answer as it is; with several leaves, a JSON "
                                "object of each leaf's answer by its node's name.",
                 "content": {"*/*": _ANY_CONTENT}},
         **errors(400, 401, 404, 413, 500, 503, 504)},
        [path_param("workflow_name", "The workflow's name.")], _PREDICTION_BODY,
        "The body reaches the start node as a /predictions body does; each next node gets its "
        "parent's answer as the input `body` (bytes), or one input per parent named by the "
        "parent's node. A failed node answers with its status and names the node.")),
]


# -- KServe's V1 protocol ----------------------------------------------------------------

_V1_NAME = [path_param("model_name", "The model's name.")]
_V1_READY = {"type": "object", "required": ["name", "ready"],
             "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}}}

_KSERVE_V1 = [
    Route("GET", "/v1/models", kserve_v1.list_models, Operation(
        "v1ListModels", "The registered models' names.", {
            "200": json_answer("Names.", {
                "type": "object", "required": ["models"],
                "properties": {"models": {"type": "array", "items": {"type": "string"}}}}),
            **errors(400, 401, 405, 503, schema=V2_ERROR)}), strip_slash=True),
    Route("GET", "/v1/models/{model_name}", kserve_v1.model_ready, Operation(
        "v1ModelReady", "Whether the model's default version has a live worker (503 if not).", {
            "200": json_answer("Ready.", _V1_READY),
            "503": json_answer("Not ready, or the daemon does not answer.",
                               {"oneOf": [_V1_READY, V2_ERROR]}),
            **errors(400, 401, 404, 405, schema=V2_ERROR)}, _V1_NAME), strip_slash=True),
    Route("POST", "/v1/models/{model_name}:predict", kserve_v1.predict, Operation(
        "v1Predict", "One prediction per instance, each instance a row of the batch.", {
            "200": json_answer("The predictions, in instance order.", {
                "type": "object", "required": ["predictions"],
                "properties": {"predictions": {"type": "array"}}}),
            **errors(400, 401, 404, 405, 413, 500, 503, 504, 507, schema=V2_ERROR)},
        _V1_NAME, {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["instances"],
            "properties": {"instances": {"type": "array", "minItems": 1}}}}}}),
          strip_slash=True),
]
# OpenAI's model list and retrieval are these routes (each answer has both shapes), also under
# /openai as KServe serves OpenAI's API; not described there (never were: their errors are
# raised in OpenAI's shape and relayed in KServe's, which one description cannot say)
_KSERVE_V1_UNDER_OPENAI = [replace(route, path="/openai" + route.path, operation=None)
                           for route in _KSERVE_V1]


# -- the Open Inference Protocol v2 and Triton's generate extension ---------------------

_V2_MODEL_META = {"$ref": "#/components/schemas/V2ModelMetadata"}
_V2_MODEL_READY = {"$ref": "#/components/schemas/V2ModelReady"}
_V2_HEADER_LENGTH = {
    "name": "Inference-Header-Content-Length", "in": "header", "required": False,
    "description": "With the binary tensor extension: the length in bytes of the JSON "
                   "header that starts the body; binary tensors follow it in order.",
    "schema": {"type": "integer", "minimum": 0},
}
_V2_INFER_BODY = {
    "required": True,
    "description": "JSON tensors, or with the binary tensor extension the JSON header "
                   "(Inference-Header-Content-Length bytes), then the binary tensors in order.",
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/V2InferRequest"}},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    }}
_V2_INFER_ANSWERS = {
    "200": {
        "description": "The outputs: JSON, or a JSON header and binary tensors when binary "
                       "outputs were asked for.",
        "headers": {
            "x-request-id": {"schema": {"type": "string"}},
            "Inference-Header-Content-Length": {"description": "Present with binary outputs.",
                                                "schema": {"type": "integer"}},
        },
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/V2InferResponse"}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    },
    **errors(400, 401, 404, 405, 413, 500, 503, 504, 507, schema=V2_ERROR),
}
_GENERATE_BODY = {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/GenerateRequest"}}}}


def _v2_model_path(versioned: bool) -> tuple[str, str, list[dict[str, Any]]]:
    """A v2 model's path, its operations' id suffix and its path parameters."""
    return ("/v2/models/{model_name}" + ("/versions/{model_version}" if versioned else ""),
            "Version" if versioned else "", model_params(versioned))


def _v2_model(versioned: bool) -> list[Route]:
    """A model's v2 routes: ``/v2/models/{model_name}[/versions/{model_version}]...``."""
    base, suffix, params = _v2_model_path(versioned)
    return [
        Route("GET", base, v2.model_metadata, Operation(
            f"v2ModelMetadata{suffix}", "Model metadata.", {
                "200": json_answer("Name, versions, platform and declared tensors.",
                                   _V2_MODEL_META),
                **errors(400, 401, 404, 405, 503, schema=V2_ERROR)}, params),
              strip_slash=True),
        Route("GET", f"{base}/ready", v2.model_ready, Operation(
            f"v2ModelReady{suffix}",
            "200 when a worker of the model version is live, else 503.", {
                "200": json_answer("Ready.", _V2_MODEL_READY),
                "503": json_answer("Not ready, or the daemon does not answer.",
                                   {"oneOf": [_V2_MODEL_READY, V2_ERROR]}),
                **errors(400, 401, 404, 405, schema=V2_ERROR)}, params), strip_slash=True),
        Route("POST", f"{base}/infer", v2.infer, Operation(
            f"v2ModelInfer{suffix}", "Inference.", _V2_INFER_ANSWERS,
            [*params, _V2_HEADER_LENGTH], _V2_INFER_BODY), strip_slash=True),
    ]


def _generate(versioned: bool) -> list[Route]:
    """Triton's generate extension, on a v2 model's path."""
    base, suffix, params = _v2_model_path(versioned)
    generation_errors = errors(400, 401, 404, 405, 413, 500, 503, 504, 507, schema=V2_ERROR)
    return [
        Route("POST", f"{base}/generate", v2.generate, Operation(
            f"v2Generate{suffix}", "The whole generated text.", {
                "200": {"description": "The answer.", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/GenerateResponse"}}}},
                **generation_errors}, params, _GENERATE_BODY), strip_slash=True),
        Route("POST", f"{base}/generate_stream", v2.generate_stream, Operation(
            f"v2GenerateStream{suffix}",
            "The generated text as server-sent events, a part each.", {
                "200": {"description": "The answer.",
                        "content": {"text/event-stream": {"schema": EVENT}}},
                **generation_errors}, params, _GENERATE_BODY), strip_slash=True),
    ]


_V2 = [
    Route("GET", "/v2", v2.server_metadata, Operation(
        "v2ServerMetadata", "Server metadata.", token=False, answers={
            "200": json_answer("Name, version and extensions.",
                               {"$ref": "#/components/schemas/V2ServerMetadata"}),
            **errors(405, schema=V2_ERROR)}), strip_slash=True),
    Route("GET", "/v2/health/live", v2.server_live, Operation(
        "v2ServerLive", "200 while the daemon answers.", token=False, answers={
            "200": json_answer("Live.", {"type": "object", "required": ["live"],
                                         "properties": {"live": {"type": "boolean"}}}),
            **errors(405, 503, schema=V2_ERROR)}), strip_slash=True),
    Route("GET", "/v2/health/ready", v2.server_ready, Operation(
        "v2ServerReady", "200 when the start-up models have live workers, else 503.",
        token=False, answers={
            "200": json_answer("Ready.", {"$ref": "#/components/schemas/V2Ready"}),
            "503": json_answer("Not ready, or the daemon does not answer.", {"oneOf": [
                {"$ref": "#/components/schemas/V2Ready"}, V2_ERROR]}),
            **errors(405, schema=V2_ERROR)}), strip_slash=True),
    *_v2_model(versioned=False),
    *_v2_model(versioned=True),
    *_generate(versioned=False),
    *_generate(versioned=True),
]


# -- OpenAI's API ------------------------------------------------------------------------

_OPENAI_ERRORS = errors(400, 401, 404, 405, 413, 500, 503, 504, 507, schema=OPENAI_ERROR)


def _generation(op_id: str, summary: str, request: str, answer: str) -> Operation:
    return Operation(op_id, summary, {
        "200": {"description": f"{answer}; with \"stream\": true, server-sent events (one "
                               "chunk each) ending with data: [DONE].",
                "content": {"application/json": {"schema": {"type": "object"}},
                            "text/event-stream": {"schema": EVENT}}},
        **_OPENAI_ERRORS},
        body={"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request}"}}}})


_OPENAI = [
    Route("POST", "/v1/chat/completions", openai.chat_completions, _generation(
        "chatCompletions", "Chat: the messages through the model's chat template.",
        "ChatCompletionRequest", "A chat.completion"), strip_slash=True),
    Route("POST", "/v1/completions", openai.completions, _generation(
        "completions", "Text completion of a prompt.", "CompletionRequest",
        "A text_completion"), strip_slash=True),
    Route("POST", "/v1/embeddings", openai.embeddings, Operation(
        "embeddings", "One vector per input text.", {
            "200": json_answer("A list of embeddings.", {"type": "object"}),
            **_OPENAI_ERRORS},
        body={"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/EmbeddingRequest"}}}}), strip_slash=True),
]
# Jina's and Cohere's rerank, as vLLM serves it (at /v1/rerank, /v2/rerank and /rerank)
_RERANK_BODY = {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["model", "query", "documents"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "query": {"type": "string", "minLength": 1},
        "documents": {"type": "array", "minItems": 1, "items": {"oneOf": [
            {"type": "string"},
            {"type": "object", "required": ["text"],
             "properties": {"text": {"type": "string"}}}]}},
        "top_n": {"type": "integer", "minimum": 0},
        "return_documents": {"type": "boolean"}}}}}}
_RERANK = [
    Route("POST", path, rerank.rerank, Operation(
        f"rerank{suffix}", "The documents ranked by a cross-encoder's relevance to the query.",
        {"200": json_answer("The results, best first.", {
            "type": "object", "required": ["id", "model", "results", "usage"],
            "properties": {"results": {"type": "array", "items": {
                "type": "object", "required": ["index", "relevance_score"]}}}}),
         **_OPENAI_ERRORS}, body=_RERANK_BODY), strip_slash=True)
    for path, suffix in (("/v1/rerank", "V1"), ("/v2/rerank", "V2"), ("/rerank", ""))]
# also under /openai, as KServe serves OpenAI's API
_OPENAI_UNDER_OPENAI = [
    replace(route, path="/openai" + route.path, operation=replace(
        route.operation, id="openai" + route.operation.id) if route.operation else None)
    for route in _OPENAI]


# -- the inference port ------------------------------------------------------------------

INFERENCE = Router(
    [*_TORCHSERVE, *_KSERVE_V1, *_V2, *_OPENAI, *_OPENAI_UNDER_OPENAI,
     *_KSERVE_V1_UNDER_OPENAI, *_RERANK],
    inference.not_found,
    # a path no route takes, by the protocol its prefix names (the first that matches)
    [(("/predictions/", "/explanations/"), inference.prediction_miss),
     (("/openai/v1/models", "/v1/models"), kserve_v1.not_found),
     (OPENAI_PATHS, openai.not_found),
     (("/v2/",), v2.not_found)])


def inference_api() -> dict[str, Any]:
    """The OpenAPI 3 document of the inference address."""
    return document(
        "mservd inference API",
        "TorchServe's inference API: predictions and explanations from the registered "
        "models, and health. Errors are {code, type, message}; KServe's V1 routes "
        "(/v1/models...) answer errors as {error}. The Open Inference Protocol v2 routes "
        "(/v2/...) answer errors as {error}; OpenAI's (/v1/chat/completions, /v1/completions, "
        "/v1/embeddings, also under /openai) and the rerank routes (/v1/rerank, /v2/rerank, "
        "/rerank) as {error: {message, type, param, code}}.",
        INFERENCE.routes, {**HEALTH_SCHEMAS, **V2_SCHEMAS, **OPENAI_SCHEMAS})


# -- the management port -----------------------------------------------------------------

_SCALE_PARAMS = (
    query("min_worker", "Workers to run (default 1).", INT),
    query("max_worker", "The most workers (at least min_worker).", INT),
    query("synchronous", "Wait until the workers are ready (default false).", BOOL),
)
_DESCRIPTIONS = {"type": "array", "items": {"$ref": "#/components/schemas/ModelDescription"}}


def _model_management(versioned: bool) -> list[Route]:
    """Describe, scale and unregister, of the default version or of one."""
    path = "/models/{model_name}" + ("/{model_version}" if versioned else "")
    suffix = "Version" if versioned else ""
    return [
        Route("GET", path, management.describe, Operation(
            f"describeModel{suffix}", "Describe the model's default version" + (
                ", one version, or every version ('all')." if versioned else "."),
            {"200": json_answer("One description per version.", _DESCRIPTIONS),
             **errors(400, 401, 404, 500, 503, 504)},
            [*model_params(versioned, "A version, or 'all'."),
             query("customized", "Ask the version's handler for its own metadata (its "
                                 "describe_handle()), shown as customizedMetadata; not with "
                                 "'all'.", BOOL)])),
        Route("PUT", path, management.scale, Operation(
            f"scaleModel{suffix}", "Scale the worker pool of the " + (
                "version." if versioned else "default version."),
            {"200": json_answer("Scaled (synchronous=true).", STATUS),
             "202": json_answer("Processing worker updates...", STATUS),
             **errors(400, 401, 404, 500, 503)},
            [*model_params(versioned), *_SCALE_PARAMS])),
        Route("DELETE", path, management.unregister, Operation(
            f"unregisterModel{suffix}", "Unregister the " + (
                "version" if versioned else "default version")
            + " and stop its workers (needs --enable-model-api).",
            {"200": json_answer("Unregistered.", STATUS),
             **errors(400, 401, 403, 404, 405, 503)},
            model_params(versioned))),
    ]


_TRAFFIC_DOC = {"type": "object", "description": (
    'Weights alone, {"1.0": 90, "2.0": 10}, or the whole policy: {"weights": {version: weight}, '
    '"sticky": bool, "shadow": {version: percent}, "maxErrorRate": {version: 0..1}}.'),
    "additionalProperties": True}
# mservd's own (TorchServe cannot split traffic): the static segment outranks {model_version}
_TRAFFIC = [
    Route("PUT", "/models/{model_name}/traffic", management.set_traffic, Operation(
        "setTraffic", "Share the model's unversioned requests among its versions by weight, "
        "optionally sticky by the traffic key header, with shadow copies and error bounds.",
        {"200": json_answer("Traffic set.", STATUS), **errors(400, 401, 404, 503)},
        model_params(False), body={"required": True, "content": {"application/json": {
            "schema": _TRAFFIC_DOC}}})),
    Route("GET", "/models/{model_name}/traffic", management.describe_traffic, Operation(
        "describeTraffic", "The model's traffic policy and each version's state under it.",
        {"200": json_answer("The policy (policy: false: the default version takes all).",
                            {"type": "object"}), **errors(400, 401, 404, 503)},
        model_params(False))),
    Route("DELETE", "/models/{model_name}/traffic", management.clear_traffic, Operation(
        "clearTraffic", "Remove the policy: the default version serves every unversioned "
        "request again.", {"200": json_answer("Traffic removed.", STATUS),
                           **errors(400, 401, 404, 503)}, model_params(False))),
]

MANAGEMENT = [
    *_descriptions(_describe_management),
    Route("POST", "/models", management.register, Operation(
        "registerModel", "Register an archive (needs --enable-model-api).", {
            "200": json_answer("Registered, with its initial workers ready (or none asked).",
                               STATUS),
            "202": json_answer("Registered; the workers are starting.", STATUS),
            **errors(400, 401, 404, 405, 409, 500, 503)}, [
            query("url", "The archive: a file or folder in the model store (no '..'), or an "
                         "http(s) URL matching allowed_urls.", {"type": "string"},
                  required=True),
            query("model_name", "Register under this name instead of the archive's.",
                  {"type": "string"}),
            query("handler", "Use this handler instead of the archive's.", {"type": "string"}),
            query("batch_size", "Requests per batch.", INT),
            query("max_batch_delay", "Milliseconds to wait to fill a batch.", INT),
            query("initial_workers", "Workers to start.", INT),
            query("synchronous", "Wait until the initial workers are ready (default true).",
                  BOOL),
            query("response_timeout", "Seconds a batch may take.", INT),
            query("startup_timeout", "Seconds a worker may take to load.", INT),
        ])),
    Route("GET", "/models", management.list_models, Operation(
        "listModels", "The registered models, by name.", {
            "200": json_answer("One page of models.",
                               {"$ref": "#/components/schemas/ModelList"}),
            **errors(400, 401, 503)}, [
            query("limit", "Models per page (default 100).", INT),
            query("next_page_token", "The nextPageToken of the previous page.",
                  {"type": "string"}),
        ])),
    *_model_management(versioned=False),
    *_model_management(versioned=True),
    Route("PUT", "/models/{model_name}/{model_version}/set-default", management.set_default,
          Operation("setDefaultVersion", "Make the version the model's default.", {
              "200": json_answer("Default version updated.", STATUS),
              **errors(400, 401, 404, 503)}, model_params(True))),
    *_TRAFFIC,
    Route("POST", "/workflows", management.register_workflow, Operation(
        "registerWorkflow", "Register a workflow archive (.war) and its nodes as models (needs "
        "--enable-model-api).", {
            "200": json_answer("Registered, every node's workers ready.", STATUS),
            **errors(400, 401, 404, 405, 409, 500, 503)}, [
            query("url", "The .war: a file directly in the workflow store, or an http(s) URL "
                         "matching allowed_urls.", {"type": "string"}, required=True),
            query("workflow_name", "Register under this name instead of the archive's.",
                  {"type": "string"}),
            query("response_timeout", "Seconds one /wfpredict may take (default "
                                      "default_response_timeout).", INT),
            query("startup_timeout", "Seconds a node's worker may take to load.", INT),
        ])),
    Route("GET", "/workflows", management.list_workflows, Operation(
        "listWorkflows", "The registered workflows, by name.", {
            "200": json_answer("One page of workflows.", {"type": "object"}),
            **errors(400, 401, 503)}, [
            query("limit", "Workflows per page (default 100).", INT),
            query("next_page_token", "The nextPageToken of the previous page.",
                  {"type": "string"}),
        ])),
    Route("GET", "/workflows/{workflow_name}", management.describe_workflow, Operation(
        "describeWorkflow", "Describe a workflow: its defaults and its graph.", {
            "200": json_answer("One description.", {"type": "array"}),
            **errors(400, 401, 404, 503)},
        [path_param("workflow_name", "The workflow's name.")])),
    Route("DELETE", "/workflows/{workflow_name}", management.unregister_workflow, Operation(
        "unregisterWorkflow", "Unregister a workflow and its node models (needs "
        "--enable-model-api).", {
            "200": json_answer("Unregistered.", STATUS),
            **errors(400, 401, 404, 405, 503)},
        [path_param("workflow_name", "The workflow's name.")])),
    Route("GET", "/token", management.rotate_key, Operation(
        "rotateKey", "Replace the inference or management key; authorize with the API key.", {
            "200": json_answer("The new key.", {
                "type": "object", "required": ["type", "key"],
                "properties": {"type": {"type": "string"}, "key": {"type": "string"}}}),
            **errors(400, 401, 503)},
        [query("type", "Which key to replace.",
               {"type": "string", "enum": ["inference", "management"]})])),
]


def management_api() -> dict[str, Any]:
    """The OpenAPI 3 document of the management address."""
    return document(
        "mservd management API",
        "TorchServe's management API: register, describe, scale, version and unregister "
        "models, and rotate keys. Errors are {code, type, message}.",
        MANAGEMENT, dict(MANAGEMENT_SCHEMAS))


# The dashboard, on the management port's event loop (its stream stays open): a page for a
# browser, not part of TorchServe's API, so not described (a fuzzer would wait on its stream).
DASHBOARD = Router([
    Route("GET", "/dashboard", DashboardRoutes.dashboard, None, strip_slash=True),
    Route("POST", "/dashboard/login", DashboardRoutes.login, None, strip_slash=True),
    Route("POST", "/dashboard/logout", DashboardRoutes.logout, None, strip_slash=True),
    Route("GET", "/dashboard/overview", DashboardRoutes.overview_document, None,
          strip_slash=True),
    Route("GET", "/dashboard/events", DashboardRoutes.events, None, strip_slash=True),
    Route("POST", "/dashboard/actions/scale", DashboardRoutes.scale, None, strip_slash=True),
    Route("POST", "/dashboard/actions/set-default", DashboardRoutes.set_default, None,
          strip_slash=True),
    Route("POST", "/dashboard/actions/traffic", DashboardRoutes.traffic, None,
          strip_slash=True),
    Route("GET", "/dashboard/static/{file}", DashboardRoutes.static, None, strip_slash=True),
], dashboard.not_found)

# Prometheus' text, on the metrics port; TorchServe describes none there.
METRICS = Router([Route("GET", "/metrics", metrics.metrics, None)], metrics.not_found,
                 wrong_method=metrics.wrong_method)
