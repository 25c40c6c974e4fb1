"""The HTTP frontends' ASGI application: what gunicorn's ASGI workers serve on every HTTP port.

gunicorn owns the sockets and the HTTP/1.1 wire (its C parser, limits, keep-alive, timeouts,
pipelining); this app owns what a request means. One request, socket to answer: gunicorn parses
it and calls :meth:`FrontendApp.__call__`, which picks the API by the port it came in on —

- inference: the routes of ``routes.INFERENCE`` (TorchServe's, KServe V1, v2 and OpenAI's),
  on this event loop (predictions go to the controller through the :class:`~.gateway.Gateway`
  and :class:`~mservd.frontends.async_bridge.AsyncBridge`);
- management: the Flask app of ``management.py`` (its rules made from ``routes.MANAGEMENT``),
  served by a2wsgi on a thread pool (a register call may wait minutes for a model to load),
  calling the same bridge through :class:`BlockingBridge`; and the dashboard
  (``routes.DASHBOARD``), on the event loop, since its stream stays open;
- metrics: ``routes.METRICS``' one route —

then sends the :class:`Answer` and writes one access-log line. The app keeps no state beyond a
request but the door's per-model counters (``shedding.py``) and its line to the controller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
from collections.abc import Awaitable, Callable
from typing import Any, cast

from a2wsgi import WSGIMiddleware
from a2wsgi.asgi_typing import HTTPRequestEvent, HTTPScope, SendEvent

from mservd import protocol
from mservd.errors import MservdError, NoWorker
from mservd.frontends.async_bridge import TOKEN_QUESTION_TIMEOUT, AsyncBridge
from mservd.frontends.bridge import ClientGone, ControllerGone
from mservd.frontends.http import dashboard, management, routes
from mservd.frontends.http.access_log import AccessLog
from mservd.frontends.http.bodies import BodyBudget
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.request import (
    JSON,
    Answer,
    HttpRequest,
    error_answer,
    relay,
)
from mservd.frontends.log_throttle import throttled
from mservd.protocol import Reply
from mservd.specs import HttpFrontendSpec

log = throttled("mservd.frontends.http")

ACCESS_FLUSH = 0.1  # seconds between writes of the access log's buffered lines
MANAGEMENT_THREADS = 32  # management calls in progress at once per process (each may wait)
# Objects allocated, net of those freed, before the collector scans the youngest (Python's
# default is 700). A request's objects (its task, scope, futures, closures) are freed by
# reference counting once it is answered or refused: no cycle is left (none found at c=64 or
# under a 1.4x overload), so a collection frees nothing and only scans what is in flight. At
# 700 the two frontends ran ~85 a second at tiny c=64 (4 % of their CPU), and under overload,
# with hundreds of requests in flight outliving the young generation, 10-25 % of their CPU
# went on collections. At 10,000: none at c=64, ~6 ms each under overload.
YOUNG_COLLECTION_AFTER = 10_000


class BlockingBridge:
    """The controller's line as the management app's threads see it: calls that block."""

    def __init__(self, bridge: AsyncBridge, loop: asyncio.AbstractEventLoop) -> None:
        self.bridge = bridge
        self.loop = loop

    def manage(self, op: str, args: dict[str, Any], token: str | None, timeout: float,
               api: str = protocol.API_MANAGEMENT) -> Reply:
        return self._wait(self.bridge.manage(op, args, token, timeout, api), timeout)

    def ask_open(self, op: str, args: dict[str, Any], token: str | None,
                 timeout: float) -> Reply:
        """A management question anyone may ask, spaced (``AsyncBridge.ask_open``)."""
        return self._wait(self.bridge.ask_open(op, args, token, timeout), timeout)

    def refusal(self, token: str | None, client: str | None = None) -> Reply | None:
        """The controller's refusal of a management key, or None (``AsyncBridge.refusal``;
        ``client``: the caller's address)."""
        return self._wait(self.bridge.refusal(token, protocol.API_MANAGEMENT, client=client),
                          TOKEN_QUESTION_TIMEOUT)

    def answered(self, token: str | None, status: int) -> None:
        self.loop.call_soon_threadsafe(self.bridge.answered, token, protocol.API_MANAGEMENT,
                                       status)

    def _wait(self, call: Any, timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(call, self.loop)
        try:
            return future.result(timeout + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ControllerGone(f"No answer from the controller within {timeout:.0f} s.") \
                from None


class FrontendApp:
    """The ASGI app; ``spec`` is what the daemon wrote for the HTTP frontends (``arbiter.py``).

    Built in gunicorn's arbiter before it forks (so the workers share its imported pages); all
    that holds a file, a socket or a loop is made at ``lifespan.startup``, in each worker."""

    def __init__(self, spec: HttpFrontendSpec) -> None:
        self.spec = spec
        self.apis = {port: api for api, port in spec.ports.items()}
        self.reply_timeout = spec.reply_timeout
        self.bridge: AsyncBridge | None = None
        self.access: AccessLog | None = None
        self.routes: dict[str, Callable[[HttpRequest, dict[str, Any]], Awaitable[Answer]]] = {}
        self.inference: Gateway | None = None  # its door: the connections ask it first
        self.bodies = BodyBudget(spec.body_bytes)  # bytes of request bodies held (bodies.py)
        self.wsgi: WsgiRoutes | None = None  # the management app
        # cors_allowed_*: headers every answer carries, rendered once
        self.cors = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                     for k, v in spec.cors.items()]

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)
        # no websocket scope comes: FrontendProtocol serves an upgrade request as plain HTTP

    # -- one request ---------------------------------------------------------------------

    async def http(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        request = HttpRequest(scope, receive, self.bodies)
        api = self.apis.get(scope["server"][1] if scope.get("server") else 0, "inference")
        try:
            if (self.cors and request.method == "OPTIONS"
                    and "access-control-request-method" in request.headers):
                answer = Answer(200, b"")  # a browser's preflight: it sends no token
            else:
                answer = await self.routes[api](request, scope)
        except MservdError as exc:
            answer = error_answer(request.path, exc)
        except ControllerGone as exc:
            answer = error_answer(request.path, NoWorker(str(exc)))
        except ClientGone:
            answer = Answer(499, b"")  # nobody to answer
        except Exception:  # a bug must cost one answer, never the worker
            log.exception("%s request %s %s failed", api, request.method, request.path)
            answer = error_answer(request.path,
                                  MservdError("Internal error; see frontend.log."))
        try:
            if answer.status != 499:
                await self.send(send, answer)
        finally:
            request.on_hang_up(None)
            if request.held:
                self.bodies.give_back(request.held)
            if self.access is not None:  # None once the worker has stopped
                self.access.write(request.client, request.method, request.target,
                                  request.version, answer.status, request.started, answer.rid)

    async def send(self, send: Callable, answer: Answer) -> None:
        headers = [(b"content-type", answer.content_type.encode("latin-1"))]
        headers += [(k.encode("latin-1"), str(v).encode("latin-1")) for k, v in answer.headers]
        headers += self.cors
        if answer.stream is None:
            headers.append((b"content-length", str(len(answer.body)).encode()))
            await send({"type": "http.response.start", "status": answer.status,
                        "headers": headers})
            await send({"type": "http.response.body", "body": answer.body})
            return
        # streamed, as TorchServe sends it: one HTTP chunk per intermediate answer, final last
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        if answer.body:
            await send({"type": "http.response.body", "body": answer.body, "more_body": True})
        async for body in answer.stream:
            if body:  # an empty chunk would end the body early
                await send({"type": "http.response.body", "body": body, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    # -- a worker's start and stop -------------------------------------------------------

    async def lifespan(self, receive: Callable, send: Callable) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.start()
                except Exception as exc:
                    log.exception("the HTTP frontend cannot start")
                    await send({"type": "lifespan.startup.failed",
                                "message": f"{type(exc).__name__}: {exc}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def start(self) -> None:
        spec = self.spec
        loop = asyncio.get_running_loop()
        self.access = AccessLog(spec.accesslog, spec.log_format)
        self.bridge = AsyncBridge(spec.controller, spec.unknown_token_limit)
        gateway = Gateway(spec, self.bridge, loop)
        self.inference = gateway
        flask_app = management.create_management_app(BlockingBridge(self.bridge, loop),
                                                      self.reply_timeout, spec.auth,
                                                      routes.MANAGEMENT)
        self.wsgi = WsgiRoutes(flask_app, MANAGEMENT_THREADS, spec.body_timeout,
                               self.bridge if spec.auth else None)
        wsgi = self.wsgi.answer
        board = routes.DASHBOARD.serving(
            dashboard.DashboardRoutes(self.bridge, spec.auth, spec.body_timeout))
        owns = routes.DASHBOARD.owns

        async def management_routes(request: HttpRequest, scope: dict[str, Any]) -> Answer:
            if owns(request.path):
                return await board(request, scope)  # streams: on the loop, not Flask
            return await wsgi(request, scope)

        self.routes = {
            "inference": routes.INFERENCE.serving(gateway),
            "management": management_routes,
            "metrics": routes.METRICS.serving(self.bridge),
        }
        loop.call_later(ACCESS_FLUSH, self.flush_access_log)
        gc.freeze()  # this worker's routes and apps live on: full collections skip them
        gc.set_threshold(YOUNG_COLLECTION_AFTER, *gc.get_threshold()[1:])
        ready_fd = spec.ready_fd
        if ready_fd is not None:  # the daemon counts the workers that serve
            try:
                os.write(ready_fd, b"1")
            except OSError:
                pass  # the daemon stopped listening: it has what it needs

    def flush_access_log(self) -> None:
        if self.access is not None:
            self.access.flush()
            asyncio.get_running_loop().call_later(ACCESS_FLUSH, self.flush_access_log)

    def stop(self) -> None:
        if self.access is not None:
            self.access.close()
            self.access = None
        if self.wsgi is not None:
            self.wsgi.close()
        if self.bridge is not None:
            self.bridge.close()


class WsgiRoutes:
    """The Flask management app, served by a2wsgi's WSGI bridge on its pool of ``threads`` (a
    register call may wait minutes), after this app has read the body: bounded by gunicorn's
    limits and ``max_body``, and with ``bridge`` (token authorization) not read at all until
    the controller has accepted the token of a request that carries one, as a prediction's.
    The answer is gathered whole (the management API streams nothing) to be sent as every
    answer is, CORS headers and access log with it.

    a2wsgi over our own environ: its PEP 3333 mapping and thread pool, for ~0.1-0.2 ms more a
    call (three hand-overs from its thread to the loop where ours had one), on a port whose
    calls each wait on the controller."""

    def __init__(self, app: Any, threads: int, body_timeout: float,
                 bridge: AsyncBridge | None = None, max_body: int = 1 << 20) -> None:
        self.wsgi = WSGIMiddleware(app, workers=threads)
        self.body_timeout = body_timeout
        self.bridge = bridge
        self.max_body = max_body

    def close(self) -> None:
        self.wsgi.executor.shutdown(wait=False, cancel_futures=True)

    async def answer(self, request: HttpRequest, scope: dict[str, Any]) -> Answer:
        if self.bridge is not None and (request.headers.get("content-length", "0") != "0"
                                        or "transfer-encoding" in request.headers):
            refused = await self.bridge.refusal(request.token(True), protocol.API_MANAGEMENT,
                                                client=request.client)
            if refused is not None:
                return relay(refused)
        body = await request.body(self.max_body, self.body_timeout)
        # the headers WSGI is given: X_Foo and X-Foo would be one HTTP_X_FOO, so a name with
        # "_" is dropped, as gunicorn does for WSGI (the ASGI routes keep them); no Upgrade, or
        # werkzeug would take the request for a WebSocket's (mservd serves plain HTTP); the
        # length of the body as read
        headers = [(name, value) for name, value in scope["headers"]
                   if b"_" not in name and name not in (b"content-length", b"upgrade")]
        headers.append((b"content-length", str(len(body)).encode()))
        # request.path: an absolute-form target's path, as the ASGI routes see it
        wsgi_scope = cast(HTTPScope, {**scope, "path": request.path, "root_path": "",
                                      "headers": headers})
        status, parts = 500, []
        content_type, kept = JSON, []

        async def receive() -> HTTPRequestEvent:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: SendEvent) -> None:
            nonlocal status, content_type
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", ()):
                    if name == b"content-type":
                        content_type = value.decode("latin-1")
                    elif name != b"content-length":
                        kept.append((name.decode("latin-1"), value.decode("latin-1")))
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))

        await self.wsgi(wsgi_scope, receive, send)
        return Answer(status, b"".join(parts), content_type, kept)
