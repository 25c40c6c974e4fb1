"""What the daemon tells each child process it starts: one typed spec per kind of child.

A spec crosses a process boundary as JSON (an argument, or a zygote message) and is read back
with :meth:`from_json`, which refuses unknown or missing fields, so a typo is an error at start
instead of a silent default.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

S = TypeVar("S", bound="Spec")


class Spec:
    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, doc: str | dict[str, Any]) -> Self:
        values = json.loads(doc) if isinstance(doc, str) else doc
        return cls(**values)


@dataclass(frozen=True)
class WorkerSpec(Spec):
    """A backend worker (``mservd/worker/``): the model version it serves, and where."""

    worker_id: str
    endpoint: str  # the controller's backend socket
    model_name: str
    version: str
    model_dir: str
    manifest: dict[str, Any]
    handler: str
    batch_size: int
    gpu_id: int | None
    threads: int | None  # torch threads on CPU: the cores shared among the workers
    model_yaml: dict[str, Any]
    max_response_size: int
    continuous_batching: bool = False  # run mservd/worker/continuous.py's stepping loop
    # ... its streams' parts sent to the frontends straight (worker/stream_routes.py); not a
    # stateful model's, whose parts' heads may end sequences the controller keeps
    direct_streams: bool = False
    log_level: str = "INFO"
    log_format: str = "plain"
    install_py_dep_per_model: bool = False
    server_version: str = "mservd"
    limit_max_image_pixels: bool = True
    lendable: bool = False  # bind a job socket: the controller may lend the worker
    decode_input_request: bool = True  # TorchServe inputs parsed (JSON, text) or as bytes
    # handler metrics declared up front (metrics_config's model_metrics); None: TorchServe's
    model_metrics: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class HttpFrontendSpec(Spec):
    """gunicorn's arbiter and its workers (``frontends/http/arbiter.py``, ``app.py``)."""

    controller: str  # the controller's frontend socket
    workers: int
    binds: list[str]
    ports: dict[str, int]  # api ("inference", "management", "metrics") -> port
    shed_delay_ms: float
    max_queue_wait_ms: float
    connections: int
    header_timeout: float
    write_timeout: float
    body_timeout: float
    body_bytes: int  # of request bodies held at once per process (frontend_body_bytes)
    max_header_bytes: int
    accesslog: str | None
    log_format: str
    log_level: str
    auth: bool
    max_request_size: int
    reply_timeout: float
    unknown_token_limit: int = 8  # unknown tokens of one client address waiting at once
    traffic_key_header: str = "x-traffic-key"  # a request's traffic key (core/traffic.py)
    gunicorn: dict[str, Any] = field(default_factory=dict)  # gunicorn's own settings, as named
    cors: dict[str, str] = field(default_factory=dict)  # CORS headers every answer carries
    tls_ports: list[int] = field(default_factory=list)  # served over TLS with the two files:
    certificate_file: str = ""
    private_key_file: str = ""
    ready_fd: int | None = None  # the daemon counts the workers that serve on this pipe


@dataclass(frozen=True)
class GrpcFrontendSpec(Spec):
    """The gRPC frontend (``frontends/grpc/server.py``)."""

    controller: str
    host: str
    management_host: str
    inference_port: int
    management_port: int
    ports_file: str  # where it writes the ports it bound
    auth: bool
    max_request_size: int
    max_response_size: int
    reply_timeout: float
    drain_timeout: float
    connections: int  # open at once per port (frontend_connections)
    handshake_timeout: float  # seconds to a connection's HTTP/2 settings (and TLS handshake)
    write_timeout: float = 30.0  # a streaming call's answer left unread (frontend_write_timeout)
    unknown_token_limit: int = 8  # unknown tokens of one client address waiting at once
    traffic_key_header: str = "x-traffic-key"  # a call's traffic key (core/traffic.py)
    log_level: str = "INFO"
    log_format: str = "plain"
    certificate_file: str = ""  # both set: the two ports serve TLS (enable_grpc_ssl)
    private_key_file: str = ""


# The supervisor and the zygote talk over a Unix SEQPACKET socket pair, one JSON message a
# packet, a worker's log file descriptor attached to a spawn (mservd/worker/zygote.py lists them)
ZYGOTE_MESSAGE_MAX = 1 << 20


def send_zygote_message(sock: socket.socket, message: dict[str, Any],
                        fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)
