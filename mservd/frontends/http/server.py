"""The inference API's HTTP server: asyncio and httptools, one process per frontend worker.

The inference port is the hot path. Under gunicorn most of a prediction's CPU went to Python
HTTP parsing, greenlet switches and log formatting, and new connections waited behind busy
workers. Here a connection is an asyncio protocol fed by httptools (a C parser); a prediction
goes to the controller over the asyncio bridge without leaving the event loop; and a refusal
under overload costs microseconds, so shedding load actually frees the CPU it is meant to.

One request, socket to answer: :class:`Connection` parses it (requests pipelined behind it
wait their turn, so answers go out in order, and a client that hangs up is noticed at once); :meth:`HttpServer.handle` sheds it or routes it —
``/predictions`` and ``/explanations`` to :meth:`HttpServer.predict`, everything else on
this port (ping, KServe v1, Open Inference Protocol v2, OpenAPI) to the WSGI app in
``inference.py``, run on a thread with a blocking view of the same bridge — then writes the
answer and one access-log line.

Run as ``python -m mservd.frontends.http.inference_server SPEC_JSON``; the daemon writes the
spec and passes the listening socket.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import io
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from typing import Any

import httptools

from mservd import protocol
from mservd.errors import (
    BadRequest,
    MethodNotAllowed,
    MservdError,
    NoWorker,
    RequestTooLarge,
    ResourceNotFound,
)
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.bridge import ClientGone, ControllerGone, Reply
from mservd.frontends.http.access_log import AccessLog
from mservd.frontends.http.inference import (
    InferenceApp,
    forwarded_headers,
    parse_inputs,
    request_timeout_ms,
)
from mservd.frontends.http.management import create_management_app
from mservd.frontends.http.metrics import MetricsApp
from mservd.frontends.http.responses import status_line
from mservd.frontends.http.shedding import INFINITE, ModelLimit, Overloaded, Shedder
from mservd.lifeline import die_with_parent
from mservd.log_format import log_to_stderr

log = logging.getLogger("mservd.frontends.http")

# After the controller refuses a model's request as overloaded (503 with Retry-After), this
# process refuses that model's requests itself for this long: under overload most refusals
# then cost one parse here instead of a trip through the controller, which must keep up.
REFUSAL_HOLD = 0.02  # seconds
REFUSAL_HEADERS = [("Content-Type", "application/json"), ("Retry-After", "1")]
MAX_PIPELINED = 16  # requests parsed ahead of their turn on one connection before reading pauses
KEEPALIVE = 5.0  # seconds a connection may sit silent between requests
ACCESS_FLUSH = 0.1  # seconds between writes of the access log's buffered lines
MAX_URL = 8192
MAX_HEADER_BYTES = 65536
PREDICTION_PREFIXES = ("/predictions/", "/explanations/")


def is_kserve_prediction(path: str) -> bool:
    """KServe v1 ``:predict``/``:explain`` and v2 ``/infer``: served by their WSGI apps, but
    let in or refused at the door like ``/predictions``."""
    return path.startswith(("/v1/models/", "/v2/models/")) and path.endswith(
        (":predict", ":explain", "/infer"))


class Request:
    __slots__ = ("method", "url", "path", "query", "version", "headers", "body", "keep_alive",
                 "started", "client")

    def __init__(self, method: str, url: bytes, version: str, headers: dict[str, str],
                 body: bytes, keep_alive: bool, client: str) -> None:
        self.method = method
        self.url = url
        parsed = httptools.parse_url(url)
        self.path = (parsed.path or b"/").decode("latin-1")
        self.query = (parsed.query or b"").decode("latin-1")
        self.version = version
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.started = time.perf_counter()
        self.client = client


class Connection(asyncio.Protocol):
    """One client connection: parse requests, hand each to the server, write answers in order."""

    def __init__(self, server: HttpServer, api: str) -> None:
        self.server = server
        self.api = api  # the port it came in on: inference, management or metrics
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.client = "-"
        self.closed = False
        self.busy = False  # a request is being answered (reading goes on: a hang-up is seen)
        self.queued: collections.deque[Request] = collections.deque()  # pipelined behind it
        self.rid: bytes | None = None  # the prediction awaiting the controller, if any
        self.last_read = 0.0  # loop time of the last bytes read: the idle sweep's clock
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_size = 0
        self.refused: MservdError | None = None

    # -- asyncio ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if peer else "-"
        if len(self.server.connections) >= self.server.max_connections:
            log.warning("refused a connection from %s: %d open (frontend_connections)",
                        self.client, len(self.server.connections))
            transport.close()
            return
        self.server.connections.add(self)
        self.last_read = self.server.loop.time()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self.rid is not None:  # gone before its answer: the controller drops it if queued
            log.info("client went away before request %s was answered", self.rid.decode())
            self.server.bridge.cancel(self.rid)

    def data_received(self, data: bytes) -> None:
        self.last_read = self.server.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.fail(BadRequest("Protocol upgrades are not supported."))
        except httptools.HttpParserError as exc:
            self.fail(BadRequest(f"Malformed HTTP request: {exc}."))  # or what refuse() chose

    # -- httptools callbacks ---------------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_URL:
            self.refuse(MservdError(f"The request URL is longer than {MAX_URL} bytes."), 414,
                        "URITooLong")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > MAX_HEADER_BYTES:
            self.refuse(MservdError(f"The request headers exceed {MAX_HEADER_BYTES} bytes."),
                        431, "RequestHeaderFieldsTooLarge")
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        previous = self.headers.get(key)
        self.headers[key] = f"{previous}, {text}" if previous is not None else text

    def on_headers_complete(self) -> None:
        length = self.headers.get("content-length")
        limit = self.server.max_request_size
        if length is not None and length.isdigit() and int(length) > limit:
            self.refuse(RequestTooLarge(f"Request body of {length} bytes exceeds "
                                        f"max_request_size ({limit})."))
        elif self.headers.get("expect", "").lower() == "100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > self.server.max_request_size:
            self.refuse(RequestTooLarge(
                f"Request body exceeds max_request_size ({self.server.max_request_size})."))
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        parser = self.parser
        request = Request(parser.get_method().decode("latin-1"), self.url,
                          parser.get_http_version(), self.headers, b"".join(self.body),
                          parser.should_keep_alive(), self.client)
        self._reset()
        if self.busy:  # pipelined behind the one being answered: answers stay in order
            self.queued.append(request)
            if len(self.queued) >= MAX_PIPELINED and self.transport is not None:
                self.transport.pause_reading()  # enough buffered; the client can wait
            return
        self.busy = True
        self.server.dispatch(self, request)

    # -- answers ---------------------------------------------------------------------------

    def refuse(self, exc: MservdError, status: int | None = None, type_: str | None = None) -> None:
        """A request too big to read: answer it and close, without reading the rest."""
        self.refused = exc
        if status is not None:
            exc.http_status, exc.type = status, type_ or exc.type
        raise httptools.HttpParserError(exc.message)

    def fail(self, exc: MservdError) -> None:
        exc = self.refused or exc
        body = exc.to_body()
        self.write(exc.http_status, [("Content-Type", "application/json")], body, False)
        self.server.access.write(self.client, "-", "-", "-", exc.http_status,
                                 time.perf_counter(), "-")

    def write(self, status: int, headers: list[tuple[str, str]], body: bytes,
              keep_alive: bool) -> None:
        self.write_raw(render(status, headers, body, keep_alive), keep_alive)

    def write_raw(self, answer: bytes, keep_alive: bool) -> None:
        """Write a whole rendered answer (see :func:`render`)."""
        if self.closed or self.transport is None:
            return
        self.transport.write(answer)
        self.finish(keep_alive)

    def finish(self, keep_alive: bool) -> None:
        self.busy = False
        if self.closed or self.transport is None:
            return
        if not keep_alive or self.server.stopping:
            self.transport.close()
        elif self.queued:
            self.busy = True
            self.server.dispatch(self, self.queued.popleft())
            if len(self.queued) < MAX_PIPELINED:
                self.transport.resume_reading()
        else:
            self.last_read = self.server.loop.time()  # idle from now, not from the request


class ThreadBridge:
    """The asyncio bridge seen from a WSGI thread: the blocking calls the WSGI app makes."""

    def __init__(self, bridge: AsyncBridge, loop: asyncio.AbstractEventLoop) -> None:
        self.bridge = bridge
        self.loop = loop

    def call(self, rid: bytes, frames: list[bytes], timeout: float) -> Reply:
        return self._wait(self.bridge.call(rid, frames, timeout), timeout)

    def manage(self, op: str, args: dict[str, Any], token: str | None, timeout: float,
               api: str = protocol.API_MANAGEMENT) -> Reply:
        return self._wait(self.bridge.manage(op, args, token, timeout, api), timeout)

    def _wait(self, call: Any, timeout: float) -> Reply:
        future = asyncio.run_coroutine_threadsafe(call, self.loop)
        try:
            return future.result(timeout + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ControllerGone(f"No answer from the controller within {timeout:.0f} s.") \
                from None


class HttpServer:
    def __init__(self, spec: dict[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        self.spec = spec
        self.loop = loop
        self.bridge = AsyncBridge(spec["controller"])
        self.max_request_size = int(spec["max_request_size"])
        self.reply_timeout = float(spec["reply_timeout"])
        self.auth = bool(spec["auth"])
        # per model path, once it has answered: how many of its predictions may be in flight
        self.limits: dict[str, ModelLimit] = {}
        self.queue_wait = float(spec.get("max_queue_wait_ms", 0)) / 1000.0
        self.shedder = Shedder(float(spec.get("shed_delay_ms", 0)), loop, self.tick_limits)
        self.access = AccessLog(spec.get("accesslog"), spec.get("log_format", "plain"))
        blocking = ThreadBridge(self.bridge, loop)
        self.apps: dict[str, Any] = {  # the WSGI app behind each port
            "inference": InferenceApp(blocking, self.max_request_size, self.reply_timeout,
                                      self.auth),
            "management": create_management_app(blocking, self.reply_timeout, self.auth),
            "metrics": MetricsApp(blocking, 30.0),
        }
        # a management call may wait minutes for a model to load: it must not hold up /ping
        self.threads = {
            api: concurrent.futures.ThreadPoolExecutor(max_workers=size,
                                                       thread_name_prefix=f"http-{api}")
            for api, size in (("inference", 16), ("management", 32), ("metrics", 4))
        }
        self.ports = {api: str(listener["port"]) for api, listener in spec["listeners"].items()}
        self.connections: set[Connection] = set()
        self.max_connections = int(spec.get("connections", 1000))
        self.refusing: dict[str, tuple[float, bytes]] = {}  # model path -> (until, answer)
        self.refusal_bodies: dict[tuple[str, int], bytes] = {}  # (model path, limit) -> body
        self.refusal_answers: dict[bytes, bytes] = {}  # body -> the whole rendered answer
        self.stopping = False
        loop.call_later(1.0, self.close_idle)
        loop.call_later(ACCESS_FLUSH, self.flush_access_log)

    def flush_access_log(self) -> None:
        self.access.flush()
        self.loop.call_later(ACCESS_FLUSH, self.flush_access_log)

    def close_idle(self) -> None:
        """Once a second: hang up on connections silent for KEEPALIVE seconds, mid-request or
        between requests (one timer for all of them, not one per request)."""
        silent_since = self.loop.time() - KEEPALIVE
        for conn in [c for c in self.connections if not c.busy and c.last_read < silent_since]:
            if conn.transport is not None:
                conn.transport.close()
        self.loop.call_later(1.0, self.close_idle)

    def dispatch(self, conn: Connection, request: Request) -> None:
        """Answer a refused prediction here and now (no task, no controller: under overload
        this is most requests, and what it costs is what the others wait for); run the rest.
        A prediction let in counts against its model's limit from here, not from when its task
        runs: the requests read in one turn of the loop are all let in before any task runs."""
        try:
            self._dispatch(conn, request)
        except Exception:  # inside the parser's callback: a bug must cost one answer, not a 400
            log.exception("%s request %s %s failed", conn.api, request.method, request.path)
            self.answer_error(conn, request, MservdError("Internal error; see frontend.log."))

    def _dispatch(self, conn: Connection, request: Request) -> None:
        limit = None
        if conn.api == "inference" and (request.path.startswith(PREDICTION_PREFIXES)
                                        or is_kserve_prediction(request.path)):
            refusal = self.refusal(request)
            if refusal is not None:
                if request.keep_alive:
                    conn.write_raw(self.refusal_answer(refusal), True)
                else:
                    conn.write(503, REFUSAL_HEADERS, refusal, False)
                self.access.write(request.client, request.method, request.url.decode("latin-1"),
                                  request.version, 503, request.started, "-")
                return
            limit = self.limits.get(request.path)
            if limit is not None:
                limit.busy += 1
        asyncio.ensure_future(self.handle(conn, request, limit))

    def tick_limits(self, seconds: float) -> None:
        for path, limit in self.limits.items():
            was = limit.limited
            limit.tick(seconds)
            if (was == INFINITE) != (limit.limited == INFINITE):
                if was == INFINITE:
                    log.info("%s limited to %d in flight from this frontend: more arrive than "
                             "it answers within max_queue_wait_ms", path, limit.limited)
                else:
                    log.info("%s no longer limited", path)

    def refusal(self, request: Request) -> bytes | None:
        """The body of the answer to a prediction refused at the door, or None to let it in."""
        limit = self.limits.get(request.path)
        if limit is not None and limit.full():
            limit.refused += 1
            return self.refusal_body(request.path, int(limit.allowed))
        held = self.refusing.get(request.path)
        if held is not None:
            if time.monotonic() < held[0]:
                return held[1]
            del self.refusing[request.path]
        return None

    def refusal_body(self, path: str, limit: int) -> bytes:
        body = self.refusal_bodies.get((path, limit))
        if body is None:
            if len(self.refusal_bodies) > 256:
                self.refusal_bodies.clear()
            refused = Overloaded(
                f"Requested model is overloaded: {limit} of its predictions are in flight from "
                "this frontend, as many as it answers in time at its pace (max_queue_wait_ms is "
                f"{self.queue_wait * 1000:.0f} ms); retry later.")
            body = self.refusal_bodies[(path, limit)] = (
                json.dumps({"error": refused.message}).encode()  # KServe's error shape
                if is_kserve_prediction(path) else refused.to_body())
        return body

    def refusal_answer(self, body: bytes) -> bytes:
        """A refusal rendered once per body and kept: under overload it is most answers."""
        answer = self.refusal_answers.get(body)
        if answer is None:
            if len(self.refusal_answers) > 256:
                self.refusal_answers.clear()
            answer = self.refusal_answers[body] = render(503, REFUSAL_HEADERS, body, True)
        return answer

    async def handle(self, conn: Connection, request: Request,
                     limit: ModelLimit | None = None) -> None:
        status, rid = 500, "-"
        try:
            if conn.api == "inference" and request.path.startswith(PREDICTION_PREFIXES):
                status, rid = await self.predict(conn, request, limit)
            else:
                status, rid = await self.run_wsgi(conn, request, limit)
        except MservdError as exc:
            status = exc.http_status
            self.answer_error(conn, request, exc)
        except ControllerGone as exc:
            status = 503
            self.answer_error(conn, request, NoWorker(str(exc)))
        except Exception:  # a bug must cost one answer, never the connection's loop
            log.exception("%s request %s %s failed", conn.api, request.method, request.path)
            self.answer_error(conn, request, MservdError("Internal error; see frontend.log."))
        finally:
            if limit is not None:
                limit.busy -= 1
        self.access.write(request.client, request.method, request.url.decode("latin-1"),
                          request.version, status, request.started, rid)

    def answer_error(self, conn: Connection, request: Request, exc: MservdError) -> None:
        headers = [("Content-Type", "application/json"), *exc.headers.items()]
        if exc.http_status == 401:
            headers.append(("WWW-Authenticate", "Bearer"))
        body = (json.dumps({"error": exc.message}).encode() if is_kserve_prediction(request.path)
                else exc.to_body())
        conn.write(exc.http_status, headers, body, request.keep_alive)

    # -- the hot path ----------------------------------------------------------------------

    async def predict(self, conn: Connection, request: Request,
                      limit: ModelLimit | None) -> tuple[int, str]:
        if request.method not in ("POST", "PUT"):
            raise MethodNotAllowed(f"Method {request.method} is not allowed on {request.path}; "
                                   "use POST.")
        parts = request.path.split("/")
        if len(parts) not in (3, 4) or not parts[2]:
            raise ResourceNotFound(f"Requested resource is not found: {request.path}. "
                                   "Use /predictions/{model_name}[/{version}].")
        self.shedder.check()
        model = parts[2]
        version = parts[3] if len(parts) == 4 and parts[3] else None
        headers = request.headers
        inputs, payloads = parse_inputs(headers.get("content-type", ""), request.body)
        forwarded = forwarded_headers(headers)
        explain = parts[1] == "explanations"
        if explain:
            forwarded["explain"] = "True"
        rid_text = str(uuid.uuid4())
        rid = rid_text.encode()
        route = protocol.Route(rid, model, version,
                               bearer_token(headers) if self.auth else None,
                               protocol.API_INFERENCE,
                               request_timeout_ms(headers.get("x-request-timeout-ms")))
        frames = protocol.predict_frames(route, protocol.pack_meta(inputs, forwarded, explain),
                                         payloads)
        conn.rid = rid
        self.shedder.busy += 1
        try:
            reply = await self.bridge.call(rid, frames, self.reply_timeout, stream=True)
        except ClientGone:
            return 499, rid_text  # nobody to answer; connection_lost logged it
        finally:
            conn.rid = None
            self.shedder.busy -= 1
        self.learn(request, reply.status, limit)
        out = [("Content-Type", reply.content_type), ("x-request-id", rid_text)]
        if reply.headers:
            out.extend(reply.headers.items())
        if reply.status == 401:
            out.append(("WWW-Authenticate", "Bearer"))
        if reply.status == 503 and "Retry-After" in (reply.headers or {}):
            self.hold_refusal(request, reply.body)
        if reply.stream is None:
            conn.write(reply.status, out, reply.body, request.keep_alive)
        else:
            await self.write_stream(conn, request, reply, out)
        return reply.status, rid_text

    @staticmethod
    async def write_stream(conn: Connection, request: Request, reply: Reply,
                           headers: list[tuple[str, str]]) -> None:
        """A streamed answer, as TorchServe sends it: one HTTP chunk per intermediate answer,
        the final one last. Status and headers are the first part's."""
        transport = conn.transport
        head = [f"HTTP/1.1 {status_line(reply.status)}\r\n"]
        head.extend(f"{name}: {value}\r\n" for name, value in headers)
        head.append("Transfer-Encoding: chunked\r\n\r\n")
        if conn.closed or transport is None:
            return
        transport.write("".join(head).encode("latin-1"))
        bodies = [reply.body] if reply.body else []
        async for body in _with_first(bodies, reply.stream):
            if body and not conn.closed:  # an empty chunk would end the body early
                transport.write(b"%x\r\n%s\r\n" % (len(body), body))
        if not conn.closed:
            transport.write(b"0\r\n\r\n")
        conn.finish(request.keep_alive)

    # -- the rest of the inference API -----------------------------------------------------

    def learn(self, request: Request, status: int, limit: ModelLimit | None) -> None:
        """An answered prediction tells its model's door limit how quickly it answers."""
        if status < 300 and self.queue_wait:
            if limit is None:  # known once it answers: a client's typo makes no entry
                limit = self.limits.setdefault(request.path, ModelLimit(self.queue_wait))
            limit.answered(time.perf_counter() - request.started)

    def hold_refusal(self, request: Request, body: bytes) -> None:
        """The controller refused this model: refuse it here, the same way, for a moment."""
        self.refusing[request.path] = (time.monotonic() + REFUSAL_HOLD, body)

    async def run_wsgi(self, conn: Connection, request: Request,
                       limit: ModelLimit | None = None) -> tuple[int, str]:
        predicting = conn.api == "inference" and is_kserve_prediction(request.path)
        if predicting:  # KServe v1 and v2 predictions are shed like /predictions
            self.shedder.check()
            self.shedder.busy += 1
        try:
            environ = self.environ(request, conn.api)
            status, headers, body = await self.loop.run_in_executor(
                self.threads[conn.api], _call_wsgi, self.apps[conn.api], environ)
        finally:
            if predicting:
                self.shedder.busy -= 1
        rid = next((v for k, v in headers if k.lower() == "x-request-id"), "-")
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        if predicting:
            self.learn(request, status, limit)
            if status == 503 and any(k.lower() == "retry-after" for k, _ in headers):
                self.hold_refusal(request, body)
        conn.write(status, headers, body, request.keep_alive)
        return status, rid

    def environ(self, request: Request, api: str) -> dict[str, Any]:
        environ = {
            "REQUEST_METHOD": request.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": request.path,
            "QUERY_STRING": request.query,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": self.ports[api],
            "SERVER_PROTOCOL": f"HTTP/{request.version}",
            "REMOTE_ADDR": request.client,
            "CONTENT_LENGTH": str(len(request.body)),
            "wsgi.input": io.BytesIO(request.body),
            "wsgi.errors": sys.stderr,
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
        for name, value in request.headers.items():
            if name == "content-type":
                environ["CONTENT_TYPE"] = value
            elif name != "content-length":
                environ["HTTP_" + name.upper().replace("-", "_")] = value
        return environ

    # -- start and stop --------------------------------------------------------------------

    async def serve(self) -> None:
        servers = []
        for api, listener in self.spec["listeners"].items():
            sock = socket.socket(fileno=listener["fd"])
            servers.append(await self.loop.create_server(
                lambda api=api: Connection(self, api), sock=sock, backlog=2048))
        ready_fd = self.spec.get("ready_fd")
        if ready_fd is not None:  # the daemon waits for this before it says it is ready
            os.write(ready_fd, b"1")
            os.close(ready_fd)
        stop = asyncio.Event()
        self.loop.add_signal_handler(signal.SIGTERM, stop.set)
        self.loop.add_signal_handler(signal.SIGINT, lambda: None)  # the daemon stops us
        await stop.wait()
        await self.drain(servers)

    async def drain(self, servers: list[asyncio.AbstractServer]) -> None:
        """Stop accepting, close idle connections, answer the rest within graceful_timeout."""
        self.stopping = True
        for server in servers:
            server.close()
        deadline = time.monotonic() + float(self.spec.get("graceful_timeout", 30))
        while time.monotonic() < deadline:
            for conn in list(self.connections):
                if not conn.busy and conn.transport is not None:
                    conn.transport.close()
            if not self.connections:
                break
            await asyncio.sleep(0.05)
        for pool in self.threads.values():
            pool.shutdown(wait=False, cancel_futures=True)
        self.bridge.close()


def render(status: int, headers: list[tuple[str, str]], body: bytes, keep_alive: bool) -> bytes:
    """One whole HTTP/1.1 answer: status line, headers, Content-Length, body."""
    head = [f"HTTP/1.1 {status_line(status)}\r\n"]
    head.extend(f"{name}: {value}\r\n" for name, value in headers)
    head.append(f"Content-Length: {len(body)}\r\n")
    if not keep_alive:
        head.append("Connection: close\r\n")
    head.append("\r\n")
    return "".join(head).encode("latin-1") + body


async def _with_first(first: list[bytes], rest: Any):
    for body in first:
        yield body
    async for body in rest:
        yield body


def _call_wsgi(app: InferenceApp, environ: dict[str, Any]) -> tuple[int, list, bytes]:
    captured: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info=None) -> None:
        captured["status"] = int(status.split(" ", 1)[0])
        captured["headers"] = headers

    chunks = app(environ, start_response)
    try:
        body = b"".join(chunks)
    finally:
        if hasattr(chunks, "close"):
            chunks.close()
    return captured["status"], captured["headers"], body


def bearer_token(headers: dict[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    die_with_parent(signal.SIGTERM)  # a killed daemon takes its frontends with it
    log_to_stderr(spec.get("log_level", "INFO"), spec.get("log_format", "plain"))
    try:
        import uvloop
    except ImportError:
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    server = HttpServer(spec, loop)
    log.info("HTTP frontend serving %s", ", ".join(
        f"{api} on port {listener['port']}" for api, listener in spec["listeners"].items()))
    try:
        loop.run_until_complete(server.serve())
    finally:
        server.access.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
