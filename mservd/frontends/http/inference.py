"""TorchServe's inference routes, on the worker's event loop: ``/predictions`` and
``/explanations`` (the hot path) and ``/ping``.

``routes.py`` declares them, with the inference port's other protocols (KServe V1 in
``kserve_v1.py``, v2 in ``v2.py``, OpenAI's in ``openai.py``); every prediction, whatever its
protocol, passes the one :class:`~.gateway.Gateway`.
"""

from __future__ import annotations

from collections.abc import Awaitable

from mservd import protocol
from mservd.errors import MservdError, ResourceNotFound
from mservd.frontends.bridge import client_network
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.request import (
    Answer,
    HttpRequest,
    forwarded_headers,
    not_allowed,
    relay,
)
from mservd.frontends.http.router import Params

PREDICTION_METHODS = ("POST", "PUT", "GET")  # as TorchServe takes them; POST named in a 405


def predict(gateway: Gateway, request: HttpRequest,
            params: Params) -> Awaitable[Answer]:
    """``POST /predictions/{model_name}[/{model_version}[/{url_path}]]``: as in TorchServe, a
    path past the version reaches the handler as the ``url_path`` request header, an empty
    version is the default one, and a GET is a prediction with an empty body. (Not a
    coroutine of its own: the hot path awaits one less.)"""
    return _forward(gateway, request, params, explain=False)


def explain(gateway: Gateway, request: HttpRequest,
            params: Params) -> Awaitable[Answer]:
    """``/explanations/...``: as :func:`predict`; the handler sees ``explain: True``."""
    return _forward(gateway, request, params, explain=True)


def workflow_predict(gateway: Gateway, request: HttpRequest,
                     params: Params) -> Awaitable[Answer]:
    """``POST /wfpredict/{workflow_name}``: sent as a prediction is, with the route's workflow
    flag; the controller runs the graph (``controller/graphs.py``), its nodes run in workers,
    and nothing of it runs here. Not streamed: a workflow answers once."""
    return _forward(gateway, request, {"model_name": params["workflow_name"]}, explain=False,
                    workflow=True)


async def _forward(gateway: Gateway, request: HttpRequest, params: Params,
                   explain: bool, workflow: bool = False) -> Answer:
    model = params["model_name"]
    version = params.get("model_version") or None
    headers = request.headers
    url_path = params.get("url_path")
    if url_path is not None:  # the path past the version, as TorchServe hands it on
        headers = {**headers, "url_path": url_path}
    timeout_ms = request.timeout_ms()
    token = gateway.token(request)

    def frames(rid: bytes, body: bytes) -> list[bytes]:
        # the body as it came, a form too: the worker splits a form into its fields, once
        # the controller has checked the token
        return protocol.prediction(
            rid, model, version, token, protocol.CODEC_TORCHSERVE,
            [("body", headers.get("content-type", ""))], forwarded_headers(headers), [body],
            explain=explain, timeout_ms=timeout_ms, client=client_network(request.client),
            workflow=workflow)

    return await gateway.forward(request, frames, stream=not workflow)


async def ping(gateway: Gateway, request: HttpRequest, params: Params) -> Answer:
    return relay(await gateway.ask("ping", {}, None))


def prediction_miss(request: HttpRequest) -> MservdError:
    """A path under ``/predictions/`` or ``/explanations/`` that names no model."""
    if request.method not in PREDICTION_METHODS:
        return not_allowed(request, "POST")
    return ResourceNotFound(f"Requested resource is not found: {request.path}. "
                            "Use /predictions/{model_name}[/{version}].")


def not_found(request: HttpRequest) -> MservdError:
    """A path under none of the inference port's protocols."""
    return ResourceNotFound(f"Requested resource is not found: {request.method} "
                            f"{request.path}. Try POST /predictions/{{model_name}}.")
