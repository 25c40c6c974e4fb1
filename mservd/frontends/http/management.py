"""The management API as a Flask app: each route turns an HTTP call into one controller verb.

Not the hot path, so Flask's routing and error handling earn their cost here: ``routes.py``
declares the routes, and :func:`create_management_app` registers each as a Flask rule. Names
and versions taken from the URL are validated before they travel anywhere.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from mservd.auth import SESSION_PREFIX
from mservd.errors import MservdError, NoWorker, Unauthorized, error_body
from mservd.frontends.bridge import ControllerGone, bearer_token
from mservd.frontends.http.request import challenged, model_and_version
from mservd.frontends.http.router import Route

log = logging.getLogger(__name__)

REGISTER_PARAMS = ("url", "model_name", "handler", "batch_size", "max_batch_delay",
                   "initial_workers", "synchronous", "response_timeout", "startup_timeout")


#: a management view: ``view(call, **path parameters)``, ``call(verb, args)`` the controller's
#: answer to a verb as a Response
Call = Callable[[str, dict[str, Any]], Response]


def create_management_app(bridge: Any, timeout: float, auth: bool,
                          routes: Iterable[Route]) -> Flask:
    """The Flask app of the management ``routes`` (``routes.MANAGEMENT``), each registered as
    a URL rule of its own; ``bridge`` (a ``BlockingBridge``) takes the verbs to the
    controller."""
    app = Flask("mservd.controller.management")

    def call(op: str, args: dict[str, Any]) -> Response:
        token = bearer_token(request.headers.get("Authorization")) if auth else None
        if token and token.startswith(SESSION_PREFIX) and op != "token":
            raise Unauthorized("Token authorization failed: a dashboard session opens the "
                               "dashboard alone; send the management key.")
        if op == "token":  # it checks the API key itself: anyone may ask, spaced
            reply = bridge.ask_open(op, args, token, timeout)
        else:  # a stranger's key is asked about as anyone's question is, a known one not
            refused = bridge.refusal(token, request.remote_addr) if auth else None
            reply = refused if refused is not None else bridge.manage(op, args, token, timeout)
            if auth:
                bridge.answered(token, reply.status)
        return Response(reply.body, status=reply.status, content_type=reply.content_type,
                        headers=challenged(reply.status, list(reply.headers.items())))

    for route in routes:
        app.add_url_rule(flask_rule(route.path), f"{route.method} {route.path}",
                         functools.partial(route.handler, call), methods=[route.method])

    @app.errorhandler(MservdError)
    def on_error(exc: MservdError) -> Response:
        headers = dict(exc.headers)
        return Response(exc.to_body(), status=exc.http_status, content_type="application/json",
                        headers=headers)

    @app.errorhandler(ControllerGone)
    def on_gone(exc: ControllerGone) -> Response:
        return on_error(NoWorker(str(exc)))

    @app.errorhandler(HTTPException)
    def on_http(exc: HTTPException) -> Response:
        code = exc.code or 500
        kinds = {404: "ResourceNotFoundException", 405: "MethodNotAllowedException"}
        message = (f"Requested resource is not found: {request.method} {request.path}"
                   if code == 404 else exc.description or exc.name)
        return Response(error_body(code, kinds.get(code, exc.name), message), status=code,
                        content_type="application/json")

    @app.errorhandler(Exception)
    def on_bug(exc: Exception) -> Response:
        log.exception("management request %s %s failed", request.method, request.path)
        return Response(error_body(500, "InternalServerException", f"{type(exc).__name__}: {exc}"),
                        status=500, content_type="application/json")

    return app


def flask_rule(path: str) -> str:
    """An OpenAPI path template as a Flask rule: ``{model_name}`` becomes ``<model_name>``."""
    return re.sub(r"\{(\w+)\}", r"<\1>", path)


# -- the views, each a controller verb (routes.MANAGEMENT declares their routes) -------------


def register(call: Call) -> Response:
    args = {k: request.args.get(k) for k in REGISTER_PARAMS if request.args.get(k) is not None}
    if args.get("model_name"):
        model_and_version(args["model_name"])
    return call("register", args)


def list_models(call: Call) -> Response:
    return call("list", {"limit": request.args.get("limit"),
                         "next_page_token": request.args.get("next_page_token")})


def describe(call: Call, model_name: str, model_version: str | None = None) -> Response:
    return call("describe", {**model_and_version(model_name, model_version),
                             "customized": request.args.get("customized")})


def scale(call: Call, model_name: str, model_version: str | None = None) -> Response:
    args = model_and_version(model_name, model_version)
    for key in ("min_worker", "max_worker", "synchronous"):
        args[key] = request.args.get(key)
    return call("scale", args)


def unregister(call: Call, model_name: str, model_version: str | None = None) -> Response:
    return call("unregister", model_and_version(model_name, model_version))


def set_default(call: Call, model_name: str, model_version: str) -> Response:
    return call("set_default", model_and_version(model_name, model_version))


def set_traffic(call: Call, model_name: str) -> Response:
    # the text travels, not its values: msgpack cannot carry every number JSON can
    text = request.get_data().decode("utf-8", "replace")
    return call("set_traffic", {**model_and_version(model_name), "traffic": text})


def describe_traffic(call: Call, model_name: str) -> Response:
    return call("describe_traffic", model_and_version(model_name))


def clear_traffic(call: Call, model_name: str) -> Response:
    return call("clear_traffic", model_and_version(model_name))


def rotate_key(call: Call) -> Response:
    return call("token", {"type": request.args.get("type")})


# -- workflows (TorchServe's workflow management API) ------------------------------------------

REGISTER_WORKFLOW_PARAMS = ("url", "workflow_name", "response_timeout", "startup_timeout")


def _workflow(name: str) -> dict[str, Any]:
    return {"workflow": model_and_version(name)["model"]}


def register_workflow(call: Call) -> Response:
    """``POST /workflows``: the parameters in the query, or in a JSON body as TorchServe takes
    them."""
    body = request.get_json(silent=True) if request.content_length else None
    source = body if isinstance(body, dict) else request.args
    args = {k: source.get(k) for k in REGISTER_WORKFLOW_PARAMS if source.get(k) is not None}
    if args.get("workflow_name"):
        _workflow(str(args["workflow_name"]))
    return call("register_workflow", args)


def list_workflows(call: Call) -> Response:
    return call("list_workflows", {"limit": request.args.get("limit"),
                                   "next_page_token": request.args.get("next_page_token")})


def describe_workflow(call: Call, workflow_name: str) -> Response:
    return call("describe_workflow", _workflow(workflow_name))


def unregister_workflow(call: Call, workflow_name: str) -> Response:
    return call("unregister_workflow", _workflow(workflow_name))
