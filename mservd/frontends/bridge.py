"""What the frontends share about the controller: its answer, the ways a call ends without
one, and the bearer token of a request.

The line itself is ``async_bridge.py`` (one DEALER socket per frontend process).
"""

from __future__ import annotations

from typing import Any


class ControllerGone(Exception):
    """No answer from the controller in time: it is stopping or has died."""


class ClientGone(Exception):
    """The HTTP client closed its connection before its answer was ready."""


class Reply:
    """An answer. A streamed one has ``stream``: the bodies of the later parts, final one last;
    ``status``, ``content_type`` and ``headers`` are then those of the first part."""

    __slots__ = ("body", "content_type", "headers", "status", "stream")

    def __init__(self, status: int, content_type: str, headers: dict[str, str], body: bytes,
                 stream: Any = None):
        self.status = status
        self.content_type = content_type
        self.headers = headers
        self.body = body
        self.stream = stream


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
