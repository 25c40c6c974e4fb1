"""The bytes of request bodies one HTTP frontend process holds at once, bounded.

Each connection may send a body up to ``max_request_size`` and take ``frontend_body_timeout``
to send it; without a bound, with token auth off (when anyone may send a body), a stranger's
thousand connections, each withholding the last byte of a 6 MB body, would make one frontend
hold 6 GB for a minute. A body counts from the moment it is read (a ``Content-Length``
reserved before its first byte, a chunked body as its chunks arrive) until its answer has
been sent; one that would take the process past ``frontend_body_bytes`` is refused 503
before more of it is read. A lone body is always taken, so no body under
``max_request_size`` is refused on an idle frontend.
"""

from __future__ import annotations

from mservd.errors import MservdError


class BodiesFull(MservdError):
    """The frontend holds as many bytes of request bodies as it may: retry shortly."""

    http_status = 503
    type = "ServiceUnavailableException"


class BodyBudget:
    """Bytes of bodies held by one frontend process's requests (its event loop alone)."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> None:
        """Count ``size`` more bytes, or raise :class:`BodiesFull` (nothing counted)."""
        if self.held and self.held + size > self.limit:
            raise BodiesFull(f"This frontend holds {self.held} bytes of request bodies, and "
                             f"{size} more would pass frontend_body_bytes ({self.limit}); "
                             "retry shortly.", headers={"Retry-After": "1"})
        self.held += size

    def give_back(self, size: int) -> None:
        self.held -= size
