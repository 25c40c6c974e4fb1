"""An HTTP frontend spec for unit tests: what the daemon would hand its frontends."""

from __future__ import annotations

from typing import Any

from mservd.specs import HttpFrontendSpec


def http_frontend_spec(**settings: Any) -> HttpFrontendSpec:
    return HttpFrontendSpec(**{
        "controller": "ipc:///nowhere", "workers": 1, "binds": ["127.0.0.1:0"],
        "ports": {"inference": 0, "management": 0, "metrics": 0},
        "shed_delay_ms": 0, "max_queue_wait_ms": 0, "connections": 10, "header_timeout": 5,
        "write_timeout": 5, "body_timeout": 5, "body_bytes": 1 << 30, "max_header_bytes": 8192,
        "accesslog": None, "log_format": "plain", "log_level": "INFO", "auth": False,
        "max_request_size": 1 << 20, "reply_timeout": 60, **settings})
