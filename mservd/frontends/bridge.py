"""What the frontends share about the controller: the ways a call ends without an answer,
and the bearer token of a request (HTTP header or gRPC metadata alike).

The line itself is ``async_bridge.py`` (one DEALER socket per frontend process).
"""

from __future__ import annotations


class ControllerGone(Exception):
    """No answer from the controller in time: it is stopping or has died."""


class ClientGone(Exception):
    """The HTTP client closed its connection before its answer was ready."""


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None
