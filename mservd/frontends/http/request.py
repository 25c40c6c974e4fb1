"""One HTTP request as the routes see it, its answer, and the helpers every route shares:
credentials, the headers a handler sees, the client's deadline, and the two error shapes
(TorchServe's ``{"code", "type", "message"}``, KServe's ``{"error": ...}``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from mservd.errors import (
    BadRequest,
    MethodNotAllowed,
    MservdError,
    RequestTimeout,
    RequestTooLarge,
    UnsupportedCoding,
    error_message,
)
from mservd.frontends.bridge import ClientGone, bearer_token, request_timeout_ms
from mservd.frontends.http.bodies import BodyBudget
from mservd.protocol import Reply

JSON = "application/json"
HEADERS_NOT_FORWARDED = frozenset({"authorization", "cookie"})
V2_HEADER_LENGTH = "inference-header-content-length"  # v2's binary form: the JSON part's size


@dataclass(slots=True)
class Answer:
    """What a route answers. A streamed answer has ``stream``: the bodies after ``body``."""

    status: int
    body: bytes
    content_type: str = JSON
    headers: list[tuple[str, str]] = field(default_factory=list)
    stream: AsyncIterator[bytes] | None = None
    rid: str = "-"  # the request id, for the access log


class HttpRequest:
    """One request as the routes see it: method, path, query, lower-case headers, client."""

    __slots__ = (
        "bodies",
        "client",
        "connection",
        "headers",
        "held",
        "method",
        "path",
        "query",
        "receive",
        "started",
        "version",
    )

    def __init__(self, scope: dict[str, Any], receive: Callable,
                 bodies: BodyBudget | None = None) -> None:
        self.started = time.perf_counter()
        self.bodies = bodies  # the process's bytes of bodies held (None: not counted)
        self.held = 0  # of them, this request's: given back once it is answered
        self.method: str = scope["method"]
        path: str = scope["path"]
        self.path = path if path[:1] == "/" else origin_path(path)
        self.query: str = scope["query_string"].decode("latin-1")
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            previous = headers.get(key)
            headers[key] = text if previous is None else f"{previous}, {text}"
        self.headers = headers
        client = scope.get("client")
        self.client: str = client[0] if client else "-"
        self.version: str = scope.get("http_version", "1.1")
        self.receive = receive
        self.connection = scope.get("mservd.connection")  # arbiter.FrontendProtocol

    @property
    def target(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path

    async def body(self, limit: int, seconds: float) -> bytes:
        """The whole body, refused (413) past ``limit`` bytes before more of it is read, and
        (408) if it takes longer than ``seconds`` from the end of the head: a body announced
        and never sent, or trickled a byte at a time, holds no connection for long; (501) in
        a transfer coding other than chunked; (503) if the process holds too many bytes of
        bodies already (``bodies.py``), before more of it is read."""
        coding = self.headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            # gunicorn undoes the chunking and hands on what is under it (gzip, deflate...)
            raise UnsupportedCoding(f"Transfer-Encoding {coding!r} is not supported; send "
                                    "the body as it is, or chunked.")
        length = self.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise BadRequest(f"Invalid Content-Length {length!r}.")
            if int(length) > limit:
                raise RequestTooLarge(f"Request body of {length} bytes exceeds "
                                      f"max_request_size ({limit}).")
            self._hold(int(length))
        counted = length is not None  # else each chunk is counted as it comes
        chunks: list[bytes] = []
        size = 0
        deadline = asyncio.get_running_loop().time() + seconds
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await self.receive()
            except TimeoutError:
                raise RequestTimeout(f"The request body did not arrive within {seconds:.0f} "
                                     "s (frontend_body_timeout).") from None
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestTooLarge(f"Request body exceeds max_request_size ({limit}).")
            if not counted:
                self._hold(len(chunk))
            chunks.append(chunk)
            if not message.get("more_body"):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _hold(self, size: int) -> None:
        if self.bodies is not None and size:
            self.bodies.take(size)
            self.held += size

    def on_hang_up(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` if the client hangs up before its answer is sent (None: no more)."""
        if self.connection is not None:
            self.connection.on_lost = callback

    def timeout_ms(self) -> float | None:
        """The client's own deadline from ``X-Request-Timeout-Ms``, if it sent one: how long
        the request may wait in the queue, and how long a generation may run."""
        return request_timeout_ms(self.headers.get("x-request-timeout-ms"))

    def token(self, auth: bool) -> str | None:
        """The request's bearer token when the server checks tokens, else None."""
        return bearer_token(self.headers.get("authorization")) if auth else None


def origin_path(target: str) -> str:
    """The path of an absolute-form target (``http://host/path``), which RFC 9112 asks a
    server to accept as it would ``/path``; any other target as it is."""
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return target
    slash = rest.find("/")
    return rest[slash:] if slash >= 0 else "/"


TORCHSERVE, KSERVE, OPENAI = "torchserve", "kserve", "openai"  # the three error shapes
OPENAI_PATHS = ("/v1/chat/", "/v1/completions", "/v1/embeddings", "/openai/")


def error_shape(path: str) -> str:
    """How errors on ``path`` look: KServe's ``{"error": message}``, OpenAI's ``{"error":
    {"message", "type", "param", "code"}}``, else TorchServe's ``{"code", "type", "message"}``."""
    if path.startswith(OPENAI_PATHS):
        return OPENAI
    if path == "/v2" or path.startswith(("/v1/", "/v2/")):
        return KSERVE
    return TORCHSERVE


def error_body(shape: str, status: int, type_: str, message: str) -> bytes:
    if shape == KSERVE:
        return json.dumps({"error": message}).encode()
    if shape == OPENAI:
        kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
        return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                     "code": type_}}).encode()
    return json.dumps({"code": status, "type": type_, "message": message}).encode()


def challenged(status: int, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers``, with ``WWW-Authenticate: Bearer`` when the answer is a 401 (RFC 6750)."""
    if status == 401:
        headers.append(("WWW-Authenticate", "Bearer"))
    return headers


def error_answer(path: str, exc: MservdError) -> Answer:
    """The answer to an error raised while serving ``path``, in that route's error shape."""
    return Answer(exc.http_status, error_body(error_shape(path), exc.http_status, exc.type,
                                              exc.message), JSON,
                  challenged(exc.http_status, list(exc.headers.items())))


def relay(reply: Reply, extra: list[tuple[str, str]] | None = None,
          shape: str = TORCHSERVE) -> Answer:
    """The controller's or worker's answer as it is; an error in the route's ``shape``."""
    headers = challenged(reply.status, list((reply.headers or {}).items()) + (extra or []))
    if shape != TORCHSERVE and reply.status >= 400:
        kept = [(k, v) for k, v in headers
                if k.lower() not in ("content-type", "content-length", V2_HEADER_LENGTH)]
        body = reply.body if shape == OPENAI and _is_openai_error(reply.body) else error_body(
            shape, reply.status, _error_type(reply.body), error_message(reply.body))
        return Answer(reply.status, body, JSON, kept)
    return Answer(reply.status, reply.body, reply.content_type, headers, reply.stream)


def _is_openai_error(body: bytes) -> bool:
    return body.startswith(b'{"error": {')


def _error_type(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return "InternalServerException"
    return str(doc.get("type", "InternalServerException")) if isinstance(doc, dict) else ""


def as_events(answer: Answer, shape: str) -> Answer:
    """A server-sent-event answer whose every part is an event: a part that is not (the
    controller's error when the worker died or a deadline passed mid-stream) becomes an error
    event in the route's ``shape``, then ``data: [DONE]``, so no client waits on a broken
    stream."""
    if answer.stream is None or not answer.content_type.startswith("text/event-stream"):
        return answer
    parts = answer.stream

    async def events() -> AsyncIterator[bytes]:
        async for body in parts:
            if not body or body.startswith(b"data: "):
                yield body
                continue
            error = error_body(shape, 500, _error_type(body), error_message(body))
            yield b"data: " + error + b"\n\ndata: [DONE]\n\n"

    answer.stream = events()
    return answer


def model_and_version(model: Any, version: Any = None) -> dict[str, Any]:
    """A model name and version from a URL or a body, checked before they travel anywhere
    (``all`` stands for every version)."""
    from archiver import ArchiveError
    from archiver.manifest import validate_model_name, validate_version

    try:
        validate_model_name(model)
        if version is not None and version != "all":
            validate_version(version)
    except ArchiveError as exc:
        raise BadRequest(str(exc)) from None
    return {"model": model, "version": version}


def not_allowed(request: HttpRequest, wanted: str) -> MethodNotAllowed:
    """The 405 of a request whose path is served in the method ``wanted``, not in its own."""
    return MethodNotAllowed(f"Method {request.method} is not allowed on {request.path}; "
                            f"use {wanted}.")


def forwarded_headers(headers: dict[str, str]) -> dict[str, str]:
    """The request headers a handler sees (lower-case names), without credentials."""
    return {name: value for name, value in headers.items() if name not in HEADERS_NOT_FORWARDED}
