"""A management answer as the controller sends it back, and one that must wait for workers.

Kept apart from the controller so the management verbs can build answers without importing
the loop that sends them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from mservd import protocol
from mservd.errors import MservdError


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"

    def encode(self) -> tuple[bytes, bytes]:
        body = self.body
        if isinstance(body, str):
            data = body.encode()
        elif isinstance(body, bytes):
            data = body
        else:
            data = json.dumps(body, indent=2).encode()
        return protocol.pack_reply(self.status, self.content_type, self.headers), data

    @classmethod
    def error(cls, exc: MservdError) -> Reply:
        return cls(exc.http_status, exc.to_body(), dict(exc.headers))


@dataclass
class Waiter:
    """A management answer that has to wait for workers; ``check`` returns it when ready."""

    respond: Callable[[Reply], None]
    check: Callable[[float], Reply | None]
    deadline: float
    on_timeout: Callable[[], Reply]
