"""The one path by which a worker calls its handler, for a batch and for a continuous step
alike: the rows of the decoded requests, their ids and headers, a stateful model's sequence
ids, and the contract that ``handle`` returns one output per row.

As Triton's python backend and LitServe each call the model one way, so that what a handler
sees (``context.request_ids``, ``get_request_header``, ``context.calls``) does not depend on how
the model batches.
"""

from __future__ import annotations

from typing import Any

from mservd import protocol
from mservd.worker.codecs import CODECS, Call, Codec

Running = list[tuple[protocol.Request, Codec, Call]]


class BatchShapeError(Exception):
    """The handler broke the contract: one output per request."""


def call_handler(handler: Any, context: Any, running: Running) -> list[Any]:
    """``handler.handle`` on the rows of ``running``; its outputs, one a row.

    Each call's rows follow the call before it (``call.first`` is where they begin), and each
    row carries its request's id and headers. A stateful model's sequence id goes back to the
    client as a response header, so a client that named none can go on with it (the handler
    may set the header to another).
    """
    rows: list[Any] = []
    row_ids: list[str] = []
    row_headers: list[dict[str, str]] = []
    for request, _, call in running:
        call.first = len(rows)
        rows.extend(call.rows)
        row_ids.extend([request.rid.decode()] * len(call.rows))
        row_headers.extend([request.handler_headers()] * len(call.rows))
    context.calls = [(call, codec) for _, codec, call in running for _ in call.rows]
    context.v2_requests = [call.state if codec is CODECS[protocol.CODEC_V2] else None
                           for call, codec in context.calls]  # read by handlers.v2
    context.begin_batch(row_ids, row_headers)
    for request, _, call in running:
        sequence = (request.server_headers or {}).get(protocol.SEQUENCE_ID)
        if sequence is not None:
            context.set_response_header(call.first, protocol.SEQUENCE_ID, sequence)
    outputs = handler.handle(rows, context)
    if not isinstance(outputs, (list, tuple)) or len(outputs) != len(rows):
        got = len(outputs) if isinstance(outputs, (list, tuple)) else type(outputs).__name__
        raise BatchShapeError(
            f"Handler returned {got} outputs for a batch of {len(rows)} requests; "
            "handle() must return a list with one item per request.")
    return list(outputs)


def describe_failure(exc: BaseException) -> tuple[int, str, str]:
    """Status, type and message of a failed handler call: the handler's own code when it gave
    one, typed ``InternalServerException`` as TorchServe types every error its handlers raise."""
    message = getattr(exc, "message", None) or str(exc)
    code = getattr(exc, "error_code", None)
    if isinstance(exc, BatchShapeError):
        return 500, "InternalServerException", message
    if isinstance(code, int) and 400 <= code <= 599:
        return code, "InternalServerException", message
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return 507, "OutOfMemory", f"{type(exc).__name__}: {message}"
    return 500, "InternalServerException", f"{type(exc).__name__}: {message}"
