"""The management and metrics frontend: gunicorn with gevent workers, Flask for management.

The daemon binds the listening sockets (so it knows the ports, even port 0) and passes them to
this process; gunicorn's workers share them. One WSGI callable dispatches by the port a
connection arrived on: management (Flask) or metrics. The inference port, the hot path, has
its own server processes (``inference_server.py``).

Run as ``python -m mservd.frontends.http.server SPEC_JSON``; the daemon writes the spec.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, Callable

from gunicorn.app.base import BaseApplication

from mservd.errors import ResourceNotFound
from mservd.frontends.bridge import Bridge
from mservd.frontends.http.management import create_management_app
from mservd.frontends.http.metrics import MetricsApp
from mservd.frontends.http.responses import respond_error
from mservd.lifeline import die_with_parent

# One line per request: time, client, method and path, status, latency, request id.
ACCESS_FORMATS = {
    "plain": '%(t)s %(h)s "%(r)s" %(s)s %(D)sus %({x-request-id}o)s',
    "json": '{"time": "%(t)s", "client": "%(h)s", "method": "%(m)s", "path": "%(U)s", '
            '"status": %(s)s, "latency_us": %(D)s, "request_id": "%({x-request-id}o)s"}',
}


def build_app(spec: dict[str, Any]) -> Callable:
    bridge = Bridge(spec["controller"])
    auth = spec["auth"]
    reply_timeout = float(spec["reply_timeout"])
    apps = {
        "management": create_management_app(bridge, reply_timeout, auth),
        "metrics": MetricsApp(bridge, 30.0),
    }
    by_port = {str(port): apps[api] for api, port in spec["ports"].items()}

    def dispatch(environ: dict[str, Any], start_response: Callable):
        app = by_port.get(environ.get("SERVER_PORT", ""))
        if app is None:
            return respond_error(start_response, ResourceNotFound("Unknown listener."))
        return app(environ, start_response)

    return dispatch


class FrontendServer(BaseApplication):
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        super().__init__()

    def load_config(self) -> None:
        spec = self.spec
        settings = {
            "bind": [f"fd://{fd}" for fd in spec["fds"]],
            "workers": spec["workers"],
            "worker_class": "gevent",
            "worker_connections": spec["connections"],
            "graceful_timeout": int(spec["graceful_timeout"]),
            "timeout": 0,
            "keepalive": 5,  # an idle keep-alive connection holds up a graceful stop this long
            "backlog": 2048,
            "errorlog": spec["errorlog"],
            "accesslog": spec["accesslog"],
            "access_log_format": ACCESS_FORMATS[spec.get("log_format", "plain")],
            "loglevel": spec.get("log_level", "info").lower(),
            "proc_name": "mservd-frontend",
            "limit_request_field_size": 16384,
        }
        if "control_socket_disable" in self.cfg.settings:
            settings["control_socket_disable"] = True  # one gunicorn.ctl per user would clash
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self) -> Callable:
        return build_app(self.spec)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    die_with_parent(signal.SIGTERM)  # a killed daemon takes its frontend with it, gracefully
    os.environ.pop("GUNICORN_FD", None)
    FrontendServer(spec).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
