"""The HTTP frontends under gunicorn's arbiter: its ASGI workers serve ``app.FrontendApp``.

The daemon holds the three HTTP ports (bound, never listening) and starts
``python -m mservd.frontends.http.arbiter SPEC_JSON``. gunicorn's arbiter forks
``frontend_workers`` ASGI workers (asyncio on uvloop, gunicorn-h1c's C HTTP parser), watches
them, replaces one that dies, and on SIGTERM lets them finish what they hold within
``graceful_timeout``. :class:`FrontendArbiter` opens a listener per worker on each port, all
in the port's ``SO_REUSEPORT`` group: the kernel deals connections out evenly among them, and
each worker accepts on its own. The arbiter keeps them open: a worker that dies (killed, out of
memory, hung past ``frontend_timeout``) leaves its listeners, and the connections the kernel
has already dealt them, to its replacement. Were they the worker's own, they would leave the
group with it and the kernel would reset every connection still waiting in their queues. Each
worker writes a byte to a pipe once it serves: the daemon's sign that the HTTP API is up, and
after that its count of workers started again.

gunicorn parses and bounds the request line and each header as bytes arrive (414, 431),
closes a connection silent for ``frontend_keepalive`` between requests, discards chunked
trailers, answers pipelined requests in order, and replaces a worker whose loop stops for
``frontend_timeout``. :class:`FrontendProtocol` adds what its ASGI worker lacks: a bound on a
request's whole head as it arrives (431 past ``limit_request_header_bytes``), a deadline for a
connection's first request head (and its TLS handshake), a deadline for a client that stops
reading, a cap on connections per worker counted per port from the TCP accept, TLS on the
``https://`` ports alone, idle connections closed at once on a stop, a WebSocket upgrade
request served as plain HTTP (mservd serves no WebSockets), and its refusals in mservd's JSON
error shape. It reaches into gunicorn's connection class, so the
version is pinned below 28 (``tests/unit/test_http_arbiter.py`` checks what it relies on).
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from gunicorn import glogging
from gunicorn import sock as listeners
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter
from gunicorn.asgi.protocol import ASGIProtocol
from gunicorn.errors import HaltServer
from gunicorn.workers.gasgi import ASGIWorker

from mservd.config.tls import server_context
from mservd.errors import error_body
from mservd.frontends.log_throttle import throttled
from mservd.process.lifeline import die_with_parent
from mservd.process.log_format import formatter, log_to_stderr
from mservd.specs import HttpFrontendSpec

log = throttled("mservd.frontends.http")  # strangers can make it log: lines capped

LOG_FORMAT = "plain"  # set by main(): gunicorn's own lines in mservd's format
MAX_HELLO_BYTES = 65536  # a TLS ClientHello is a few KiB; its records 16 KiB at most
ERROR_TYPES = {400: "BadRequestException", 408: "RequestTimeout", 414: "URITooLong",
               431: "RequestHeaderFieldsTooLarge", 501: "NotImplemented"}


class FrontendProtocol(ASGIProtocol):
    """gunicorn's HTTP/1.1 connection with mservd's limits (see the module)."""

    def connection_made(self, transport: Any) -> None:
        worker: FrontendWorker = self.worker
        sockname = transport.get_extra_info("sockname")
        self._inference = bool(sockname) and sockname[1] == worker.inference_port
        self._counted = False
        self._deadline = None
        self._early: list[bytes] | None = None  # a list while a TLS handshake runs
        self._hello: bytearray | None = None  # raw bytes until the TLS layer takes over
        self._in_head, self._head_bytes = True, 0  # reading a request's head, and its size
        self._heads = 0  # heads read on this connection
        self._tail = b""  # the last bytes of the previous read: a blank line may straddle it
        self.on_lost: Callable[[], None] | None = None  # set by the app while it waits
        if worker.connections[self._inference] >= worker.max_connections:
            peer = transport.get_extra_info("peername") or ("-",)
            log.warning("refused a connection from %s: %d open on the %s port "
                        "(frontend_connections)", peer[0], worker.max_connections,
                        "inference" if self._inference else "management or metrics")
            transport.abort()
            return
        self._counted = True
        worker.connections[self._inference] += 1
        worker.open.add(self)
        self._deadline = worker.loop.call_later(worker.header_timeout, self._too_slow,
                                                "headers", worker.header_timeout)
        if worker.tls is not None and bool(sockname) and sockname[1] in worker.tls_ports:
            self._start_tls(transport)
        else:
            super().connection_made(transport)

    def _start_tls(self, raw: Any) -> None:
        """An https:// port's connection: counted against the cap from its TCP accept, so a
        stalled handshake holds a socket only within the cap, and one past it costs no
        handshake. The handshake is part of the head's deadline; gunicorn sees the
        connection once it is over."""
        self._raw = raw
        self._early = []  # decrypted bytes that arrive before gunicorn sees the connection
        # the client's first bytes, read before the TLS layer is in place: uvloop starts
        # reading once connection_made returns, whatever it asked
        self._hello = bytearray()
        self._handshaking = self.worker.loop.create_task(self._handshake(raw))

    async def _handshake(self, raw: Any) -> None:
        worker: FrontendWorker = self.worker
        # runs after start_tls has put its TLS layer in place, before it starts the handshake
        # or reads again: the bytes read meanwhile go to the layer first, in order
        worker.loop.call_soon(self._hand_over_hello, raw)
        try:
            # a close waits for the client's TLS goodbye as long as for a silent client's
            # first head, not asyncio's 30 s: a stranger who never says it holds a connection
            # of the cap no longer than one who never speaks
            tls = await worker.loop.start_tls(raw, self, worker.tls, server_side=True,
                                              ssl_handshake_timeout=worker.header_timeout,
                                              ssl_shutdown_timeout=worker.header_timeout)
        except Exception as exc:  # a stranger's bytes, a reset, the deadline: the socket goes
            log.debug("a TLS handshake failed: %r", exc)
            raw.abort()
            self.connection_lost(exc)
            return
        if not self._counted or tls.is_closing():  # closed meanwhile: by its deadline (the
            tls.abort()  # TLS layer then ends its handshake without an error), or a stop
            self.connection_lost(None)
            return
        early, self._early = self._early or [], None
        super().connection_made(tls)
        for data in early:
            self.data_received(data)

    def _hand_over_hello(self, raw: Any) -> None:
        hello, self._hello = self._hello, None
        layer = raw.get_protocol()
        while hello and layer is not self:  # asyncio's and uvloop's layer: a BufferedProtocol
            buffer = layer.get_buffer(len(hello))
            n = min(len(buffer), len(hello))
            buffer[:n] = hello[:n]
            layer.buffer_updated(n)
            del hello[:n]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._counted:
            return
        self._counted = False
        if self.on_lost is not None:  # a request waits for its answer: it is not wanted now
            self.on_lost()
            self.on_lost = None
        self.worker.connections[self._inference] -= 1
        self.worker.open.discard(self)
        self._cancel_deadline()
        if self._early is None:  # gunicorn saw it
            super().connection_lost(exc)

    async def _serve_http_request(self, request, sockname, peername):
        """A prediction its model's door refuses is answered here, before gunicorn makes a
        task, a scope and an ASGI call for it: under overload that is most requests, and what
        a refusal costs is what the accepted ones wait for. The app checks the door too, for
        the requests let in here."""
        app = self.worker.asgi
        refusal = (app.inference.door.refusal(request.path)
                   if self._inference and app.inference is not None
                   and request.method != "OPTIONS" else None)  # a preflight is no prediction
        if refusal is None:
            return await super()._serve_http_request(request, sockname, peername)
        started = time.perf_counter()
        # the body unread, gunicorn closes the connection after it: the client must know
        receiver = self._body_receiver
        keep_alive = not request.should_close() and (receiver is None or receiver._complete)
        self._safe_write(self.worker.refusal_answer(refusal, keep_alive))
        if app.access is not None:
            target = f"{request.path}?{request.query}" if request.query else request.path
            app.access.write(peername[0] if peername else "-", request.method, target,
                             f"{request.version[0]}.{request.version[1]}", 503, started, "-")
        return keep_alive  # gunicorn closes it all the same if the body was not all read

    def _is_websocket_upgrade(self, request) -> bool:
        """mservd serves no WebSockets: an upgrade request is served as the plain HTTP
        request it also is (RFC 9110 lets a server ignore ``Upgrade``), so its client gets an
        answer in mservd's JSON shape, not gunicorn's bodiless 403 for an app that declines."""
        return False

    def _build_http_scope(self, request, sockname, peername):
        """gunicorn's scope, and this connection in it: the app hears of a hang-up through
        :attr:`on_lost` (cheaper than a task per request awaiting ``http.disconnect``)."""
        scope = super()._build_http_scope(request, sockname, peername)
        scope["mservd.connection"] = self
        return scope

    def data_received(self, data: bytes) -> None:
        """gunicorn bounds each header line as it arrives; this bounds them all together. Of a
        read in which a head ends only the bytes up to its blank line count: the rest are its
        body, or the next request's (bounded from the next read on)."""
        if self._early is not None:
            if self._hello is not None:  # raw bytes, read before the TLS layer took over
                self._hello += data
                if len(self._hello) > MAX_HELLO_BYTES:
                    self._raw.abort()
            else:  # decrypted, before the handshake's task resumed
                self._early.append(data)
            return
        in_head, heads, counted = self._in_head, self._heads, self._head_bytes
        tail, self._tail = self._tail, data[-3:]
        super().data_received(data)
        if not in_head or self._closed:
            return
        if heads == self._heads:  # the head goes on past this read
            counted += len(data)
        else:
            end = (tail + data).find(b"\r\n\r\n")
            counted += len(data) if end < 0 else max(0, end + 4 - len(tail))
        if self._in_head and heads == self._heads:
            self._head_bytes = counted
        limit = self.worker.max_header_bytes
        if counted > limit:
            self._send_error_response(431, f"The request headers exceed {limit} bytes")
            self.close_now()

    def _on_headers_complete(self):  # gunicorn's parser callbacks
        self._in_head = False
        self._heads += 1
        self._cancel_deadline()  # later heads are bounded by gunicorn's keepalive timer
        return super()._on_headers_complete()

    def _on_message_complete(self):
        self._in_head, self._head_bytes = True, 0
        return super()._on_message_complete()

    def pause_writing(self) -> None:
        """The client stopped reading: it has ``write_timeout`` to start again."""
        super().pause_writing()
        worker: FrontendWorker = self.worker
        self._cancel_deadline()
        self._deadline = worker.loop.call_later(worker.write_timeout, self._too_slow,
                                                "reading", worker.write_timeout)

    def resume_writing(self) -> None:
        self._cancel_deadline()
        super().resume_writing()

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self, what: str, seconds: float) -> None:
        transport = self.transport if self._early is None else self._raw
        peer = transport.get_extra_info("peername") if transport else None
        log.warning("closed the connection of %s: its %s took longer than %.0f s",
                    peer[0] if peer else "-", what, seconds)
        if self._early is not None:  # still in its TLS handshake: nothing to answer on
            self._raw.abort()
            self.connection_lost(None)
        elif what == "headers":
            self._send_error_response(408, f"The request's headers did not arrive within "
                                           f"{seconds:.0f} s")
            self.close_now()
        else:  # a close would wait for the client to read what is buffered for it
            self._closed = True
            self.transport.abort()

    def close_now(self) -> None:
        if self._early is not None:
            self._raw.abort()
            self.connection_lost(None)
            return
        self._close_transport()
        self._request_ready.set()  # wakes gunicorn's connection loop to see it closed

    def idle(self) -> bool:
        """Between requests: no request read or being answered."""
        if self._early is not None:
            return True  # in its TLS handshake
        return bool(self._awaiting_request) and not self._request_ready.is_set()

    def _send_error_response(self, status: int, message: str, extra_headers=()) -> None:
        """gunicorn's refusal of a request it cannot parse, in mservd's JSON error shape."""
        # gunicorn-h1c writes some messages with "%.*s", which Python 3.11 leaves unformatted
        text = (message or "Malformed HTTP request").replace(": %.*s", "").rstrip(".") + "."
        body = error_body(status, ERROR_TYPES.get(status, "BadRequestException"), text)
        try:
            reason = HTTPStatus(status).phrase  # gunicorn's table lacks 431
        except ValueError:
            reason = self._get_reason_phrase(status)
        worker = getattr(self, "worker", None)
        cors = worker.app.spec.cors.items() if worker is not None else ()
        head = [f"HTTP/1.1 {status} {reason}",
                "Content-Type: application/json", f"Content-Length: {len(body)}",
                *(f"{name}: {value}" for name, value in (*extra_headers, *cors)),
                "Connection: close"]
        self._safe_write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)


class FrontendWorker(ASGIWorker):
    """gunicorn's ASGI worker, making its connections :class:`FrontendProtocol`s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        spec = self.app.spec
        self.inference_port = spec.ports["inference"]
        self.max_connections = spec.connections
        self.header_timeout = spec.header_timeout
        self.write_timeout = spec.write_timeout
        self.max_header_bytes = spec.max_header_bytes
        self.connections = {True: 0, False: 0}  # open now: inference port, the others
        self.open: set[FrontendProtocol] = set()
        self.refusals: dict[tuple[bytes, bool], bytes] = {}
        self.tls_ports = set(spec.tls_ports)  # https:// addresses (mservd/config/tls.py)
        self.tls = (server_context(spec.certificate_file, spec.private_key_file)
                    if self.tls_ports else None)

    def refusal_answer(self, body: bytes, keep_alive: bool) -> bytes:
        """A door's refusal as a whole HTTP answer, rendered once per body and kept."""
        answer = self.refusals.get((body, keep_alive))
        if answer is None:
            if len(self.refusals) > 256:
                self.refusals.clear()
            head = ["HTTP/1.1 503 Service Unavailable", "Content-Type: application/json",
                    "Retry-After: 1", f"Content-Length: {len(body)}",
                    *(f"{name}: {value}" for name, value in self.app.spec.cors.items())]
            if not keep_alive:
                head.append("Connection: close")
            answer = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
            self.refusals[(body, keep_alive)] = answer
        return answer

    def _setup_event_loop(self) -> None:
        super()._setup_event_loop()
        # gunicorn records whether its C parser is there on the class it asks, and reads it
        # back from ASGIProtocol: asked from our subclass, it would refuse the parser
        ASGIProtocol._check_h1c_protocol_available()
        create_server = self.loop.create_server

        def our_server(factory: Any, **kwargs: Any) -> Any:
            # gunicorn's worker listens again with asyncio's default backlog of 100
            kwargs["backlog"] = self.cfg.backlog
            # TLS per address (gunicorn's own applies to every port or none), started by
            # FrontendProtocol once the connection is counted
            return create_server(lambda: FrontendProtocol(self), **kwargs)

        self.loop.create_server = our_server  # type: ignore[method-assign]

    async def _shutdown(self) -> None:
        """A stop: connections waiting for a next request are closed at once (gunicorn would
        wait out graceful_timeout for them); those mid-request are answered first."""
        for conn in [c for c in self.open if c.idle()]:
            conn.close_now()
        await super()._shutdown()


def slot_listeners(cfg: Any, logger: Any) -> list[Any]:
    """One worker's listeners: a socket per bound address, listening in its port's
    ``SO_REUSEPORT`` group (the daemon holds each port bound with it: no other socket binds)."""
    fds: list[int] = []
    try:
        for host, port in cfg.address:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as raw:
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                raw.bind((host, port))
                fds.append(raw.detach())
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return listeners.create_sockets(cfg, logger, fds)  # gunicorn's, listening with its backlog


class FrontendArbiter(Arbiter):
    """gunicorn's arbiter, holding every worker's listeners (see the module). A worker's
    listeners are its slot's: the replacement of a worker that died takes the slot it left."""

    def start(self) -> None:
        self.slots = [slot_listeners(self.cfg, self.log) for _ in range(self.num_workers)]
        self.LISTENERS = [lnr for slot in self.slots for lnr in slot]  # closed by a stop
        super().start()

    def give_slot(self, worker: Any) -> None:
        """Before a worker's fork: the listeners of a slot no live worker holds."""
        taken = {getattr(other, "slot", None) for other in self.WORKERS.values()}
        free = [n for n in range(len(self.slots)) if n not in taken]
        if not free:  # more workers than at the start (gunicorn's TTIN): a slot more
            self.slots.append(slot_listeners(self.cfg, self.log))
            self.LISTENERS.extend(self.slots[-1])
            free = [len(self.slots) - 1]
        worker.slot = free[0]
        worker.sockets = self.slots[worker.slot]

    def drop_other_slots(self, worker: Any) -> None:
        """In a worker after its fork: the other slots' listeners closed, so that one it never
        accepts on is held by the arbiter and its own worker alone."""
        for lnr in self.LISTENERS:
            if lnr not in worker.sockets:
                lnr.close()


class FrontendLogger(glogging.Logger):
    """gunicorn's own log lines (worker starts, exits, timeouts) in mservd's log format."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for handler in self.error_log.handlers:
            handler.setFormatter(formatter(LOG_FORMAT))


class FrontendServer(BaseApplication):
    def __init__(self, spec: HttpFrontendSpec) -> None:
        self.spec = spec
        super().__init__()

    def load_config(self) -> None:
        spec = self.spec
        settings = {
            "bind": spec.binds,
            # FrontendArbiter opens the listeners, in SO_REUSEPORT groups, and deals them out
            # to the workers: gunicorn's reuse_port would have each worker open its own
            "reuse_port": False,
            "pre_fork": lambda arbiter, worker: arbiter.give_slot(worker),
            "post_fork": lambda arbiter, worker: arbiter.drop_other_slots(worker),
            "workers": spec.workers,
            "worker_class": "mservd.frontends.http.arbiter.FrontendWorker",
            "asgi_loop": "uvloop",
            "http_parser": "fast",  # gunicorn-h1c, a dependency
            "asgi_lifespan": "on",  # a worker whose app cannot start fails the start
            "preload_app": True,  # imported once in the arbiter: the workers share its pages
            "logger_class": FrontendLogger,
            "loglevel": spec.log_level.lower(),
            "errorlog": "-",  # stderr: the daemon points it at frontend.log
            "accesslog": None,  # the app writes TorchServe's access log itself
            "control_socket_disable": True,
            # header names with underscores reach the app: TorchServe's clients send
            # ts_request_sequence_id, and its handlers see every header. "drop" guards a WSGI
            # environ, where X_Foo and X-Foo are one name; ASGI keeps names apart, and our
            # bridge to the management app (app.py) drops them itself
            "header_map": "dangerous",
            "proc_name": "mservd-http",
            **spec.gunicorn,  # limits and timeouts from config.properties
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def run(self) -> None:
        FrontendArbiter(self).run()

    def load(self) -> Any:
        from mservd.frontends.http.app import FrontendApp

        app = FrontendApp(self.spec)
        # what the workers inherit is never collected: a full collection walked all of it and
        # held a worker's loop 25-40 ms under load, a burst the controller's queue then took
        gc.collect()
        gc.freeze()
        return app


def main(argv: list[str] | None = None) -> int:
    global LOG_FORMAT
    argv = sys.argv[1:] if argv is None else argv
    spec = HttpFrontendSpec.from_json(argv[0])
    die_with_parent(signal.SIGTERM)  # a killed daemon takes the arbiter, and so its workers
    LOG_FORMAT = spec.log_format
    log_to_stderr(spec.log_level, LOG_FORMAT)
    log.info("HTTP frontends: gunicorn's arbiter, %d ASGI workers, ports %s",
             spec.workers, spec.ports)
    try:
        FrontendServer(spec).run()  # the workers too leave through here (SystemExit)
    except HaltServer as exc:  # raised again while it stops when two workers fail to boot
        log.error("gunicorn's arbiter stopped: %s", exc.reason)
        return exc.exit_status
    return 0


if __name__ == "__main__":
    sys.exit(main())
