"""The management port's WSGI side (``app.WsgiRoutes``): a2wsgi runs the Flask app on its
threads, after the frontend has bounded the body and had the token checked; what Flask is
handed (the path, the headers) and what comes back (status, headers, body) as the ASGI routes
would have them."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import unquote

import pytest
from flask import Flask, Response, request

from mservd.errors import RequestTooLarge
from mservd.frontends.http.app import WsgiRoutes
from mservd.frontends.http.request import Answer, HttpRequest
from mservd.protocol import Reply


def echo_app() -> Flask:
    app = Flask("echo")

    @app.route("/models/<name>", methods=["GET", "POST"])
    def echo(name: str) -> Response:
        environ = request.environ
        doc = {"name": name, "path": environ["PATH_INFO"], "body": request.get_data().decode(),
               "upgrade": environ.get("HTTP_UPGRADE"), "x_foo": environ.get("HTTP_X_FOO"),
               "client": request.remote_addr, "query": request.args.get("q")}
        return Response(json.dumps(doc), status=201, content_type="application/json",
                        headers={"X-Out": "1"})

    return app


def call(routes: WsgiRoutes, method: str, path: str, headers: list[tuple[bytes, bytes]],
         body: bytes = b"", query: bytes = b"") -> tuple[Answer, list[str]]:
    """``path`` as the client sends it; the scope's is percent-decoded, as gunicorn's."""
    read: list[str] = []

    async def receive() -> dict:
        read.append("body")
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": method, "path": unquote(path), "raw_path": path.encode(),
             "query_string": query, "headers": headers, "client": ("10.0.0.7", 5555),
             "server": ("127.0.0.1", 8081), "http_version": "1.1", "scheme": "http"}

    async def run() -> Answer:
        try:
            return await routes.answer(HttpRequest(scope, receive), scope)
        finally:
            routes.close()

    return asyncio.run(run()), read


def test_flask_gets_the_request_as_the_asgi_routes_see_it() -> None:
    headers = [(b"host", b"h"), (b"upgrade", b"websocket"), (b"connection", b"Upgrade"),
               (b"x_foo", b"smuggled"), (b"content-length", b"5")]
    answer, _ = call(WsgiRoutes(echo_app(), 2, 5.0), "POST", "http://h:1/models/m%C3%A9",
                     headers, b"hello", b"q=1")
    assert answer.status == 201 and answer.content_type == "application/json"
    assert ("x-out", "1") in answer.headers
    assert not any(name == "content-length" for name, _ in answer.headers)
    assert json.loads(answer.body) == {
        "name": "mé", "path": "/models/m\xc3\xa9", "body": "hello",  # PEP 3333's latin-1
        "upgrade": None,  # not a WebSocket's: werkzeug would answer 405
        "x_foo": None,  # x_foo and x-foo would be one HTTP_X_FOO: dropped, as gunicorn does
        "client": "10.0.0.7", "query": "1"}


def test_a_body_past_the_limit_is_refused_before_flask_runs() -> None:
    with pytest.raises(RequestTooLarge):
        call(WsgiRoutes(echo_app(), 2, 5.0, max_body=4), "POST", "/models/m",
             [(b"content-length", b"5")], b"hello")


def test_a_strangers_body_is_not_read_before_the_controller_accepts_its_token() -> None:
    class Bridge:
        async def refusal(self, token: str | None, api: str, client: str | None = None):
            return Reply(401, b'{"code": 401}', content_type="application/json") \
                if token != "good" else None

    routes = WsgiRoutes(echo_app(), 2, 5.0, Bridge())  # type: ignore[arg-type]
    answer, read = call(routes, "POST", "/models/m",
                        [(b"authorization", b"Bearer bad"), (b"content-length", b"5")], b"hello")
    assert answer.status == 401 and read == []
    assert ("WWW-Authenticate", "Bearer") in answer.headers
    routes = WsgiRoutes(echo_app(), 2, 5.0, Bridge())  # type: ignore[arg-type]
    answer, read = call(routes, "POST", "/models/m",
                        [(b"authorization", b"Bearer good"), (b"content-length", b"5")], b"hello")
    assert answer.status == 201 and read == ["body"]
