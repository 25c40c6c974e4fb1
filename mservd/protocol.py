"""The ZeroMQ wire between frontends, the controller and backend workers.

Every message is a list of frames; the first is ``MSV1`` followed by one kind byte. Headers are
msgpack; payloads are raw frames that nobody between the frontend and the worker decodes or
copies into new objects. The controller reads only the small *route* header of a request and the
request id frame of a reply; the *meta* header (input names, content types, HTTP headers) is
opaque to it and forwarded as the same bytes::

    frontend -> controller  PREDICT  | MSV1P | route | meta | input 0 | ... | input k |
                            MANAGE   | MSV1M | {"id", "op", "args", "token"}         |
                            CANCEL   | MSV1X | rid |   (the client went away: drop it if queued)
    controller -> frontend  REPLY    | MSV1R | rid | reply | body |
                            CHUNK    | MSV1C | rid | reply | body |   (a streamed part)
    controller -> worker    BATCH    | MSV1B | rid | meta | inputs... | rid | meta | ... |
                            STOP     | MSV1S |
    worker -> controller    READY    | MSV1H | {"pid"} |
                            FAILED   | MSV1F | {"message", "traceback"} |
                            DONE     | MSV1D | rid | reply | body | rid | reply | body | ... |
                            CHUNK    | MSV1C | rid | reply | body |
                            METRICS  | MSV1Q | [[name, value, unit, kind, {dim: value}], ...] |

    route = [rid, model, version or None, token or None, api, timeout_ms or None, sent]
            (sent: the frontend's time.monotonic() when it sent the request; CLOCK_MONOTONIC
            is one clock for every process on the host, so the controller sees the transit)
    meta  = [[[name, content_type], ...], {header: value}, explain]  (msgpack array)
    reply = [status, content_type, {header: value}]                  (msgpack array)

A ROUTER prepends the peer's identity frame; the functions here take and return frames after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import msgpack

MAGIC = b"MSV1"
PREDICT = MAGIC + b"P"
MANAGE = MAGIC + b"M"
REPLY = MAGIC + b"R"
CHUNK = MAGIC + b"C"
BATCH = MAGIC + b"B"
CANCEL = MAGIC + b"X"
STOP = MAGIC + b"S"
READY = MAGIC + b"H"
FAILED = MAGIC + b"F"
DONE = MAGIC + b"D"
METRICS = MAGIC + b"Q"

KINDS = frozenset({PREDICT, MANAGE, CANCEL, REPLY, CHUNK, BATCH, STOP, READY, FAILED, DONE,
                   METRICS})

API_INFERENCE = "inference"
API_MANAGEMENT = "management"

packb = msgpack.packb


def unpackb(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise ProtocolError(f"undecodable header: {exc}") from None


class ProtocolError(Exception):
    """A message that does not follow the layout above; the receiver drops it and logs."""


def kind_of(frames: Sequence[bytes]) -> bytes:
    if not frames or frames[0] not in KINDS:
        head = frames[0][:8] if frames else b""
        raise ProtocolError(f"unknown message kind {head!r}")
    return frames[0]


@dataclass(frozen=True, slots=True)
class Route:
    """What the controller needs to place a request: never the payload."""

    rid: bytes
    model: str
    version: str | None
    token: str | None
    api: str
    timeout_ms: float | None = None  # the client's own queue deadline, if it sent one
    sent: float | None = None  # the frontend's time.monotonic() at sending; set by predict_frames


def predict_frames(route: Route, meta: bytes, inputs: Sequence[bytes]) -> list[bytes]:
    header = packb([route.rid, route.model, route.version, route.token, route.api,
                    route.timeout_ms, time.monotonic() if route.sent is None else route.sent])
    return [PREDICT, header, meta, *inputs]


def parse_route(frame: bytes) -> Route:
    fields = unpackb(frame)
    if not isinstance(fields, list) or len(fields) != 7:
        raise ProtocolError("route header must be a 7-item array")
    rid, model, version, token, api, timeout_ms, sent = fields
    if not isinstance(rid, bytes) or not isinstance(model, str):
        raise ProtocolError("route header has a bad request id or model name")
    if timeout_ms is not None and not isinstance(timeout_ms, (int, float)):
        raise ProtocolError("route header has a bad timeout")
    if sent is not None and not isinstance(sent, (int, float)):
        raise ProtocolError("route header has a bad send time")
    return Route(rid, model, version, token, api, timeout_ms, sent)


def pack_meta(inputs: Sequence[tuple[str, str]], headers: dict[str, str], explain: bool) -> bytes:
    return packb([list(inputs), headers, explain])


def pack_reply(status: int, content_type: str, headers: dict[str, str] | None = None) -> bytes:
    return packb([status, content_type, headers or {}])


def unpack_reply(frame: bytes) -> tuple[int, str, dict[str, str]]:
    status, content_type, headers = unpackb(frame)
    return status, content_type, headers


@dataclass(frozen=True, slots=True)
class RequestInBatch:
    """One request as a worker sees it: id, input names and types, HTTP headers, payloads."""

    rid: bytes
    inputs: list[tuple[str, str]]
    headers: dict[str, str]
    explain: bool
    payloads: list[bytes]


def parse_batch(frames: Sequence[bytes]) -> list[RequestInBatch]:
    """Split a BATCH message (without its kind frame) into requests."""
    requests = []
    i, n = 0, len(frames)
    while i < n:
        if i + 2 > n:
            raise ProtocolError("batch ends inside a request")
        rid = frames[i]
        inputs, headers, explain = unpackb(frames[i + 1])
        count = len(inputs)
        payloads = list(frames[i + 2 : i + 2 + count])
        if len(payloads) != count:
            raise ProtocolError(f"request {rid!r} announces {count} inputs, batch has fewer")
        requests.append(RequestInBatch(rid, [tuple(x) for x in inputs], headers, explain, payloads))
        i += 2 + count
    return requests
