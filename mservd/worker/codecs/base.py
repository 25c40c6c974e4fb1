"""What every codec is: a decoded request (:class:`Call`) and the three functions, and the
one way an answer is encoded (:func:`encode_answer`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from mservd import protocol


@dataclass(slots=True)
class Call:
    """A decoded request: its rows for the handler, where they start in the batch, and what
    its codec keeps to encode the answer."""

    rows: list[dict[str, Any]]
    first: int = 0  # the index of its first row in the handler's batch
    state: Any = field(default=None)


class Codec(Protocol):
    def decode(self, request: protocol.Request, context: Any) -> Call: ...

    def encode(self, call: Call, outputs: list[Any], context: Any,
               limit: int) -> tuple[bytes, bytes]: ...

    def encode_part(self, call: Call, item: Any, context: Any,
                    limit: int) -> tuple[bytes, bytes] | None: ...

    def error(self, status: int, type_: str, message: str) -> tuple[bytes, bytes]: ...


def encode_answer(codec: Codec, call: Call, outputs: list[Any], context: Any,
                  limit: int) -> tuple[bytes, bytes]:
    """A request's answer from the handler's outputs for its rows: a ``RequestError`` among
    them (a row the handler refused) answers the request with that error, in its protocol's
    shape; anything else is the codec's to encode."""
    from handlers.errors import RequestError

    for item in outputs:
        if isinstance(item, RequestError):
            return codec.error(item.status, item.type, item.message)
    return codec.encode(call, outputs, context, limit)


class WholeParts:
    """A streamed part is encoded like a whole answer (TorchServe's way: each part is a body
    of its own, the client joins them). An empty text carries nothing and is not sent: a
    generation step that added no text (half of a character, a request still being read)
    must not begin the answer, whose status may yet be an error."""

    def encode_part(self, call: Call, item: Any, context: Any,
                    limit: int) -> tuple[bytes, bytes] | None:
        if isinstance(item, str) and not item:
            return None
        return encode_answer(self, call, [item], context, limit)  # type: ignore[arg-type]


def too_large(size: int, limit: int) -> str:
    return f"Response of {size} bytes exceeds max_response_size ({limit})."
