"""The metrics API: ``GET /metrics`` in Prometheus text format, rendered by the controller."""

from __future__ import annotations

from typing import Any, Callable

from mservd.errors import MethodNotAllowed, MservdError, NoWorker, ResourceNotFound
from mservd.frontends.bridge import ControllerGone
from mservd.frontends.http.responses import respond, respond_error


class MetricsApp:
    def __init__(self, bridge: Any, timeout: float) -> None:
        self.bridge = bridge
        self.timeout = timeout

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO") or "/"
        try:
            if path != "/metrics":
                raise ResourceNotFound(f"Requested resource is not found: {path}. Try /metrics.")
            if environ["REQUEST_METHOD"] != "GET":
                raise MethodNotAllowed("Use GET /metrics.")
            reply = self.bridge.manage("metrics", {}, None, self.timeout)
            return respond(start_response, reply.status, reply.body, reply.content_type)
        except MservdError as exc:
            return respond_error(start_response, exc)
        except ControllerGone as exc:
            return respond_error(start_response, NoWorker(str(exc)))
