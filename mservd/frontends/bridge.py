"""What the frontends share about the controller: the ways a call ends without an answer,
what a request says of itself the same way over HTTP and gRPC (header or metadata): its
bearer token and its own deadline, and the tokens the controller accepted lately.

The line itself is ``async_bridge.py`` (one DEALER socket per frontend process).
"""

from __future__ import annotations

import ipaddress
import time

from mservd.errors import BadRequest

TOKEN_MEMORY = 5.0  # seconds a token the controller accepted is taken without asking again


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


class AcceptedTokens:
    """Tokens the controller accepted lately. A frontend asks the controller about a request's
    token before reading its body (a stranger's costs no more than its head); a client's next
    requests skip the question for TOKEN_MEMORY seconds. The controller still checks each
    prediction itself."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def knows(self, token: str | None, now: float) -> bool:
        return token is not None and self._until.get(token, 0.0) > now

    def accepted(self, token: str | None, now: float) -> None:
        if token is None:
            return
        if len(self._until) >= 16:  # keys are few; anything else is stale
            self._until.clear()
        self._until[token] = now + TOKEN_MEMORY

    def forget(self, token: str | None) -> None:
        """``token`` was revoked (a dashboard logout): ask about it again next time."""
        self._until.pop(token or "", None)

    def answered(self, token: str | None, status: int) -> None:
        """The controller answered a call that carried ``token``: anything but 401 means it
        took the token, so the client's next calls skip the question while it keeps calling,
        whatever flood of strangers' questions waits."""
        if status != 401:
            self.accepted(token, time.monotonic())


def request_timeout_ms(value: str | None) -> float | None:
    """Milliseconds from an ``X-Request-Timeout-Ms`` value (None: not sent)."""
    if value is None:
        return None
    try:
        timeout = float(value)
    except ValueError:
        raise BadRequest(f"Invalid X-Request-Timeout-Ms {value!r}: give milliseconds, "
                         "e.g. 250.") from None
    if not timeout >= 0:  # NaN too: it would compare as no deadline at all
        raise BadRequest(f"Invalid X-Request-Timeout-Ms {value!r}: it must be a number of "
                         "milliseconds, not negative.")
    return timeout


def client_network(address: str | None) -> str | None:
    """What a client's address counts as when strangers' questions are bounded per client:
    an IPv4 address itself, an IPv6 one its /64 (one host is handed a whole /64), None when
    unknown (not bounded per client)."""
    if not address or address == "-":
        return None
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # a Unix socket's path or the like: itself
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # an IPv4 client of a dual-stack socket
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
