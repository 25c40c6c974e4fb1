"""The management API as a Flask app: each route turns an HTTP call into one controller verb.

Not the hot path, so Flask's routing and error handling earn their cost here. Names and
versions taken from the URL are validated before they travel anywhere.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from mservd.auth import SESSION_PREFIX
from mservd.errors import MservdError, NoWorker, Unauthorized, error_body
from mservd.frontends.bridge import ControllerGone, bearer_token
from mservd.frontends.http.request import challenged, model_and_version

log = logging.getLogger(__name__)

REGISTER_PARAMS = ("url", "model_name", "handler", "batch_size", "max_batch_delay",
                   "initial_workers", "synchronous", "response_timeout", "startup_timeout")


def create_management_app(bridge: Any, timeout: float, auth: bool) -> Flask:
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

    names = model_and_version

    @app.post("/models")
    def register() -> Response:
        args = {k: request.args.get(k) for k in REGISTER_PARAMS if request.args.get(k) is not None}
        if args.get("model_name"):
            names(args["model_name"])
        return call("register", args)

    @app.get("/models")
    def list_models() -> Response:
        return call("list", {"limit": request.args.get("limit"),
                             "next_page_token": request.args.get("next_page_token")})

    @app.get("/models/<model>")
    @app.get("/models/<model>/<version>")
    def describe(model: str, version: str | None = None) -> Response:
        return call("describe", {**names(model, version),
                                 "customized": request.args.get("customized")})

    @app.put("/models/<model>")
    @app.put("/models/<model>/<version>")
    def scale(model: str, version: str | None = None) -> Response:
        args = names(model, version)
        for key in ("min_worker", "max_worker", "synchronous"):
            args[key] = request.args.get(key)
        return call("scale", args)

    @app.delete("/models/<model>")
    @app.delete("/models/<model>/<version>")
    def unregister(model: str, version: str | None = None) -> Response:
        return call("unregister", names(model, version))

    @app.put("/models/<model>/<version>/set-default")
    def set_default(model: str, version: str) -> Response:
        return call("set_default", names(model, version))

    @app.get("/token")
    def token() -> Response:
        return call("token", {"type": request.args.get("type")})

    @app.route("/", methods=["OPTIONS"])
    @app.get("/api-description")
    def api_description() -> Response:  # OpenAPI 3; no token, as in TorchServe
        from mservd.frontends.http.openapi import management_api

        return app.json.response(management_api())

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
