"""The ZeroMQ wire between frontends, the controller and backend workers: every message is built
and parsed here, and nowhere else.

Every message is a list of frames; the first is ``MSV1`` followed by one kind byte. Headers are
msgpack; payloads are raw frames that nobody between the frontend and the worker decodes or
copies into new objects. The controller reads only the small *route* header of a request and
the request id of a result; the *meta* header (codec, input names and types, headers) is opaque
to it and forwarded as the same bytes::

    frontend -> controller  PREDICT  | MSV1P | route | meta | input 0 | ... | input k | route | ...
                            MANAGE   | MSV1M | {"id", "op", "args", "token", "api"}  |
                            CANCEL   | MSV1X | rid |   (the client went away: drop it if queued)
    controller -> frontend  REPLY    | MSV1R | rid | head | body | rid | head | body | ... |
                            CHUNK    | MSV1C | rid | head | body | rid | ... |   (streamed parts)
    controller -> worker    BATCH    | MSV1B | job | meta | inputs... | job | meta | ... |
                            CANCEL   | MSV1X | rid |   (continuous batching: drop it)
                            STOP     | MSV1S |
    worker -> controller    READY    | MSV1H | {"pid"} |
                            FAILED   | MSV1F | {"message", "traceback"} |
                            DONE     | MSV1D | rid | head | body | rid | head | body | ... |
                            ANSWERED | MSV1A | rid | head | rid | head | ... |
                            CHUNK    | MSV1C | rid | head | body | rid | ... |
                            STEPPED  | MSV1N | [[[rid, first part at], ...], [gap, ...]]? |
                                       (a continuous worker's steps go on: said when it sent the
                                       controller nothing for STEP_REPORT_INTERVAL, and before
                                       the first part of a stream it sends a frontend itself)
                            METRICS  | MSV1Q | [[name, value, unit, kind, {dim: value}], ...] |
    worker -> frontend      REPLY    | MSV1R | rid | head | body | ... |   (answers sent directly)
                            CHUNK    | MSV1C | rid | head | body | ... |   (... and parts)
    controller -> frontend  LEASE    | MSV1L | {"model", "version", "default", "jobs", "batch",
                                              "timeout"} |
                            REVOKE   | MSV1V | jobs | lost ("1" or "") |
    frontend -> worker      BATCH    | MSV1B | job | meta | inputs... | ... |   (on a lease)
    frontend -> controller  OVERDUE  | MSV1O | jobs |   (a leased batch ran past its timeout)
    controller -> worker    RECALL   | MSV1T |   (the lease ends: finish the leased batches)
    worker -> controller    RETURNED | MSV1U | used ("1" or "") |   (... done and reported: it
                                               is idle; used: it ran leased batches since)
    worker -> controller    SERVED   | MSV1E | [[fid, delivered, took, count], ...] | rid | head
                                     | body | ... |   (leased batches' answers; bodies empty
                                                       where delivered)

    route = [rid, model, version or None, token or None, timeout_ms or None, explain, sent,
             inputs, sequence or None, ends_sequence, client or None, workflow, key or None]
            (sent: the frontend's time.monotonic() when it sent the request; CLOCK_MONOTONIC
            is one clock for every process on the host, so the controller sees the transit;
            inputs: how many payload frames follow the meta, so the controller finds the next
            request of the message without reading the meta; sequence and ends_sequence:
            the client's ts_request_sequence_id and ts_request_sequence_end headers, read
            here once, for a stateful model's sequences; client: who sent it, as its
            frontend names it (an IPv4 address, an IPv6 /64), which a stateful model's
            sequence is bound to; absent from a 10-item route; workflow: a /wfpredict
            run, absent from a 10- or 11-item route; key: the client's traffic key, which a
            model whose versions share its traffic hashes onto their weights, core/traffic.py)
    meta  = [codec, [[name, content_type], ...], {header: value}]
    job   = [rid, kind, fid] or [rid, kind, fid, {header: value}]
                               (the request's id, what it asks of the handler: PREDICTION,
                                EXPLANATION or DESCRIPTION, and the frontend that asked:
                                the controller's name for it; and the headers only the server
                                sets, over the client's: a stateful model's sequence id)
    head  = [status, content_type, {header: value}]

Messages are coalesced where a process has several to send at once: a frontend sends every
request of one event-loop turn as one PREDICT, the controller answers every request that
finished for a frontend in one REPLY (and sends its streamed parts in one CHUNK), a worker
answers a whole batch in one DONE and sends the parts of one generation step in one CHUNK. A
message costs each process it passes a wake-up of ZeroMQ's I/O thread and its own, whatever
it holds.

A worker answers a finished batch to its frontends itself when it can: a frontend that binds a
reply socket (``reply_endpoint``) is known to the controller by that socket's address, so the
worker that reads it in a job connects there, tells the controller with ANSWERED (the heads
alone: the controller counts the statuses and forwards nothing) and then sends the frontend
its answers as a REPLY. An answer then passes one process fewer. Streamed answers, and any
batch whose frontend the worker cannot reach yet, go back in a DONE through the controller.

``explain`` travels in the route alone: the controller never batches an explanation with a
prediction, and the worker shows the job's kind to the handler as TorchServe does (an
``explain: True`` header, or ``describe: True`` for a describe call's question, which the
controller asks itself); a client's own header of either name never reaches the handler.
A worker that sits idle can be *lent* to a frontend (LEASE, ``mservd/core/leases.py``): the
frontend then sends the next requests of that model it reads as a BATCH to the worker's *job
socket* (``jobs``, bound in the run folder) itself, the worker answers it directly, and the
controller only hears SERVED afterwards. The job socket is a plain Unix ``SOCK_SEQPACKET``
socket, not ZeroMQ: each message is one :func:`job_message` (the frames, length-prefixed), and
the worker answers a leased batch on the same connection as one REPLY; a message over
``JOB_MESSAGE_MAX`` takes the ZeroMQ way instead (the controller, the reply socket). A lone request then passes no third process either
way. The controller takes a lease back as soon as it needs the worker: REVOKE to the frontend,
RECALL to the worker, which runs the leased batches it has, reports them and says RETURNED;
until then the controller's requests wait in its queue, where their deadlines hold. REVOKE with
``lost``: the worker is gone, and the frontend sends what it had sent there through the
controller again.
A leased batch unanswered past the version's response timeout is answered "Worker died." by
the frontend, which asks the controller to kill the worker (OVERDUE), as it kills one whose
batch hangs.

A ROUTER prepends the peer's identity frame; the functions here take and return frames after it.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

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
ANSWERED = MAGIC + b"A"
METRICS = MAGIC + b"Q"
LEASE = MAGIC + b"L"
REVOKE = MAGIC + b"V"
SERVED = MAGIC + b"E"
OVERDUE = MAGIC + b"O"
RECALL = MAGIC + b"T"
RETURNED = MAGIC + b"U"
STEPPED = MAGIC + b"N"

KINDS = frozenset({PREDICT, MANAGE, CANCEL, REPLY, CHUNK, BATCH, STOP, READY, FAILED, DONE,
                   ANSWERED, METRICS, LEASE, REVOKE, SERVED, OVERDUE, RECALL,
                   RETURNED, STEPPED})

# Seconds a continuous worker that runs requests stays silent at most between two steps'
# ends: it says STEPPED when a step sent no part and no answer for that long. The controller
# gives a step response_timeout from its last word plus this, so a step is timed, never a whole
# generation (a non-streamed one sends nothing until its end), at one small message a worker
# twice a second
STEP_REPORT_INTERVAL = 0.5

# A worker's METRICS sample of the device memory it holds (the controller keeps it on the
# worker's handle for describe and the dashboard, not as a handler metric)
DEVICE_MEMORY = "mservd_worker_device_memory_bytes"
# A generation handler's figures of its KV cache (handlers/causal_lm.py reports them through
# TorchServe's metrics API): kept per worker as well, for describe and the usage ratio
KV_USED, KV_CAPACITY, PREFIX_HITS = "KVCacheUsedTokens", "KVCacheCapacityTokens", \
    "PrefixCacheHitTokens"

API_INFERENCE = "inference"
API_MANAGEMENT = "management"

# How a request's payload is read and its answer written, one codec per protocol (mservd/worker/codecs)
CODEC_TORCHSERVE = "torchserve"  # /predictions, gRPC Predictions: inputs by name
CODEC_KSERVE_V1 = "kserve-v1"  # {"instances": [...]}: one handler row per instance
CODEC_V2 = "v2"  # the Open Inference Protocol's infer body, JSON or binary
CODEC_OPENAI = "openai"  # OpenAI's chat, completions and embeddings bodies
CODEC_GENERATE = "generate"  # Triton's generate extension
CODEC_RERANK = "rerank"  # Jina's and Cohere's rerank body (/v1/rerank, /v2/rerank)
CODECS = frozenset({CODEC_TORCHSERVE, CODEC_KSERVE_V1, CODEC_V2, CODEC_OPENAI,
                    CODEC_GENERATE, CODEC_RERANK})

JSON = "application/json"

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


# -- PREDICT: a client's request, as every frontend sends it --------------------------------


@dataclass(frozen=True, slots=True)
class Route:
    """What the controller needs to place a request: never the payload."""

    rid: bytes
    model: str
    version: str | None
    token: str | None
    timeout_ms: float | None = None  # the client's own queue deadline, if it sent one
    explain: bool = False  # /explanations: never batched with predictions
    sent: float | None = None  # the frontend's time.monotonic() at sending
    inputs: int = 0  # payload frames after the meta header
    sequence: str | None = None  # ts_request_sequence_id: a stateful model's sequence
    ends_sequence: bool = False  # ts_request_sequence_end: the sequence's last request
    client: str | None = None  # who sent it (its address), where its frontend says
    workflow: bool = False  # a workflow's run (/wfpredict), not a model's request
    key: str | None = None  # the traffic key (traffic_key_header): one key, one version


# TorchServe's headers of a stateful model's sequences (mservd/core/sequences.py)
SEQUENCE_ID = "ts_request_sequence_id"
SEQUENCE_START = "ts_request_sequence_start"
SEQUENCE_END = "ts_request_sequence_end"


def says_yes(value: str | None) -> bool:
    """A header's flag, read as TorchServe reads it (Java's ``Boolean.parseBoolean``): set
    only by ``true``, in any case; anything else, or no header, leaves it unset."""
    return value is not None and value.strip().lower() == "true"


def prediction(rid: bytes, model: str, version: str | None, token: str | None, codec: str,
               inputs: Sequence[tuple[str, str]], headers: dict[str, str],
               payloads: Sequence[bytes], *, explain: bool = False,
               timeout_ms: float | None = None, sent: float | None = None,
               client: str | None = None, workflow: bool = False,
               key: str | None = None) -> list[bytes]:
    """The PREDICT message of one request, whichever frontend and protocol it came by.

    ``inputs`` are (name, content type) pairs, one per payload; ``headers`` are what the
    handler may read (never the token), under lower-case names; ``client`` who sent it (its
    address: a stateful model's sequence takes requests only from the client that opened it);
    ``workflow``: ``model`` names a workflow (``/wfpredict``), whose graph the controller runs.
    """
    route = packb([rid, model, version, token, timeout_ms, explain,
                   time.monotonic() if sent is None else sent, len(payloads),
                   headers.get(SEQUENCE_ID), says_yes(headers.get(SEQUENCE_END)), client,
                   workflow, key])
    return [PREDICT, route, packb([codec, list(inputs), headers]), *payloads]


def with_key(message: list[bytes], key: str | None) -> list[bytes]:
    """A PREDICT message built by :func:`prediction` or :func:`predictions` whose requests
    carry the traffic ``key`` (the frontend read it from a header once, for every protocol's
    routes); the message itself when there is none."""
    if key is None:
        return message
    out = [message[0]]
    for route, frames in parse_predictions(message[1:]):
        out += [route_frame(dataclasses.replace(route, key=key)), *frames]
    return out


def group_key(group: str, key: str | None) -> str:
    """The traffic key of one of several requests that must reach one version (the choices of
    one OpenAI request), carrying the client's own key. It starts with a NUL, which gunicorn
    and gRPC refuse in a header or metadata value (a client that sent one would only pick its
    own version, as naming the version in its path does)."""
    return f"\0{group}\0{key or ''}"


def split_key(key: str | None) -> tuple[str | None, str | None]:
    """A route's traffic key as (its group, the client's key); see :func:`group_key`."""
    if key is None or not key.startswith("\0"):
        return None, key
    group, _, own = key[1:].partition("\0")
    return group, own or None


def route_frame(route: Route) -> bytes:
    """The route header of ``route``, 13 items."""
    return packb([route.rid, route.model, route.version, route.token, route.timeout_ms,
                  route.explain, route.sent, route.inputs, route.sequence, route.ends_sequence,
                  route.client, route.workflow, route.key])


def predictions(messages: Iterable[list[bytes]]) -> list[bytes]:
    """One PREDICT message of several built by :func:`prediction` (a frontend's sends of one
    event-loop turn)."""
    frames = [PREDICT]
    for message in messages:
        frames += message[1:]
    return frames


def parse_predictions(frames: Sequence[bytes]) -> Iterator[tuple[Route, list[bytes]]]:
    """The requests of a PREDICT message (without its kind frame), one at a time: each route
    with the frames the worker needs (meta and payloads), as they came. A malformed one ends
    the message with a ProtocolError; the requests before it were good."""
    i, n = 0, len(frames)
    while i < n:
        route = parse_route(frames[i])
        end = i + 2 + route.inputs
        if end > n:
            raise ProtocolError(f"request {route.rid!r} announces {route.inputs} inputs, the "
                                "message has fewer")
        yield route, list(frames[i + 1 : end])
        i = end


def parse_route(frame: bytes) -> Route:
    fields = unpackb(frame)
    if not isinstance(fields, list) or len(fields) not in (10, 11, 13):
        raise ProtocolError("route header must be a 10-item array (11 with the client, 13 with "
                            "the workflow flag and the traffic key)")
    rid, model, version, token, timeout_ms, explain, sent, inputs, sequence, ends = fields[:10]
    client = fields[10] if len(fields) >= 11 else None
    workflow, key = (fields[11], fields[12]) if len(fields) == 13 else (False, None)
    if not isinstance(rid, bytes) or not isinstance(model, str):
        raise ProtocolError("route header has a bad request id or model name")
    if version is not None and not isinstance(version, str):
        raise ProtocolError("route header has a bad version")
    if token is not None and not isinstance(token, str):
        raise ProtocolError("route header has a bad token")
    if timeout_ms is not None and not isinstance(timeout_ms, (int, float)):
        raise ProtocolError("route header has a bad timeout")
    if sent is not None and not isinstance(sent, (int, float)):
        raise ProtocolError("route header has a bad send time")
    if type(inputs) is not int or inputs < 0:
        raise ProtocolError("route header has a bad input count")
    if sequence is not None and not isinstance(sequence, str):
        raise ProtocolError("route header has a bad sequence id")
    if client is not None and not isinstance(client, str):
        raise ProtocolError("route header has a bad client")
    if not isinstance(workflow, bool):
        raise ProtocolError("route header has a bad workflow flag")
    if key is not None and not isinstance(key, str):
        raise ProtocolError("route header has a bad traffic key")
    return Route(rid, model, version, token, timeout_ms, bool(explain), sent, inputs, sequence,
                 bool(ends), client, workflow, key)


# -- BATCH: the controller hands a worker requests ------------------------------------------

# What a job asks of its handler. The worker marks the last two with the header TorchServe's
# handlers read; only the server sets those: a client's own is dropped, or one request could
# turn its batch-mates' predictions into explanations, or fail them with a describe document.
# So is a client's own ts_request_sequence_start: only the server opens a sequence (a client's
# would make a stateful handler reset the state of a sequence that goes on).
PREDICTION, EXPLANATION, DESCRIPTION = 0, 1, 2
KIND_MARKS = {EXPLANATION: "explain", DESCRIPTION: "describe"}
_MARKS = frozenset([*KIND_MARKS.values(), SEQUENCE_START])


@dataclass(frozen=True, slots=True)
class Request:
    """One request as a worker sees it: id, codec, inputs' names and types, headers, payloads,
    and the frontend that asked (``fid``: a reply endpoint, or a name only the controller
    knows)."""

    rid: bytes
    codec: str
    inputs: list[tuple[str, str]]
    headers: dict[str, str]
    payloads: list[bytes]
    kind: int = PREDICTION
    fid: bytes = b""
    server_headers: dict[str, str] | None = None  # set by the controller, over the client's

    def handler_headers(self) -> dict[str, str]:
        """The headers its handler sees: the client's, without a mark only the server sets
        (a kind's, a sequence's start), and the mark of the job's kind and the server's own
        headers (a sequence's id, and its start when the server opened it)."""
        headers = self.headers
        if any(name.lower() in _MARKS for name in headers):
            headers = {k: v for k, v in headers.items() if k.lower() not in _MARKS}
        mark = KIND_MARKS.get(self.kind)
        if mark is not None:
            headers = {**headers, mark: "True"}
        return headers if not self.server_headers else {**headers, **self.server_headers}


def batch(requests: Iterable[tuple[bytes, int, bytes, Sequence[bytes], dict | None]]
          ) -> list[bytes]:
    """The BATCH message of (rid, kind, fid, [meta, payloads...], server headers or None) as
    the controller holds them."""
    frames = [BATCH]
    for rid, kind, fid, parts, server_headers in requests:
        frames.append(packb([rid, kind, fid] if server_headers is None
                            else [rid, kind, fid, server_headers]))
        frames.extend(parts)
    return frames


def batch_of(requests: Iterable[Request]) -> list[bytes]:
    """The BATCH message of whole requests (``mservd run-handler`` and tests build one)."""
    return batch((r.rid, r.kind, r.fid,
                  [packb([r.codec, [list(i) for i in r.inputs], r.headers]), *r.payloads],
                  r.server_headers)
                 for r in requests)


def describe_question() -> list[bytes]:
    """The meta and payload frames of a describe call's question to a handler
    (``customized=true``): no input and no header; its job's kind, DESCRIPTION, has the
    worker show the handler TorchServe's ``describe: True``."""
    return [packb([CODEC_TORCHSERVE, [], {}])]


def parse_batch(frames: Sequence[bytes]) -> list[Request]:
    """The requests of a BATCH message (without its kind frame)."""
    requests = []
    i, n = 0, len(frames)
    while i < n:
        if i + 2 > n:
            raise ProtocolError("batch ends inside a request")
        job = unpackb(frames[i])
        meta = unpackb(frames[i + 1])
        if not (isinstance(job, list) and len(job) in (3, 4) and isinstance(job[0], bytes)
                and job[1] in (PREDICTION, EXPLANATION, DESCRIPTION)
                and isinstance(job[2], bytes)
                and (len(job) == 3 or isinstance(job[3], dict))):
            raise ProtocolError("a batch's job header must be [rid, kind, fid[, headers]]")
        if not (isinstance(meta, list) and len(meta) == 3 and meta[0] in CODECS
                and isinstance(meta[1], list) and isinstance(meta[2], dict)):
            raise ProtocolError("a request's meta header must be [codec, inputs, headers]")
        rid, kind, fid = job[:3]
        server_headers = job[3] if len(job) == 4 else None
        codec, inputs, headers = meta
        count = len(inputs)
        payloads = list(frames[i + 2 : i + 2 + count])
        if len(payloads) != count:
            raise ProtocolError(f"request {rid!r} announces {count} inputs, batch has fewer")
        requests.append(Request(rid, codec, [(str(a), str(b)) for a, b in inputs], headers,
                                payloads, int(kind), fid, server_headers))
        i += 2 + count
    return requests


# -- direct answers: a frontend's reply socket --------------------------------------------------

REPLY_SOCKET = "reply-"  # a frontend's reply socket is <run dir>/reply-<pid>-<random>.sock


def run_dir_of(endpoint: str) -> str | None:
    """The folder of an ``ipc://`` endpoint of the controller's (None for any other
    transport: its frontends then get no reply socket and every answer passes the controller)."""
    if not endpoint.startswith("ipc://"):
        return None
    folder, _, _ = endpoint[len("ipc://"):].rpartition("/")
    return folder or None


def reply_endpoint(controller: str, pid: int, tag: str) -> str | None:
    """Where a frontend of the controller at ``controller`` binds its reply socket."""
    folder = run_dir_of(controller)
    return None if folder is None else f"ipc://{folder}/{REPLY_SOCKET}{pid}-{tag}.sock"


def reply_prefix(backend: str) -> bytes | None:
    """What every reply endpoint of the controller whose worker socket is ``backend`` starts
    with: a worker connects to no other address a job names."""
    folder = run_dir_of(backend)
    return None if folder is None else f"ipc://{folder}/{REPLY_SOCKET}".encode()


JOB_SOCKET = "jobs-"  # a worker's job socket is <run dir>/jobs-<pid>.sock
# A message on a job socket: at most this long (a Unix socket's default send buffer is ~208 KiB;
# bigger ones go the ZeroMQ way). A SOCK_SEQPACKET pair because it skips ZeroMQ's I/O threads
# each way: what that saves a hop is in BENCHMARKS.md (`python -m benchmarks.hop_floor`).
JOB_MESSAGE_MAX = 128 * 1024
_LENGTH = struct.Struct("!I")


def job_message(frames: Sequence[bytes]) -> bytes | None:
    """``frames`` as one job-socket message (each length-prefixed); None when it would be over
    ``JOB_MESSAGE_MAX``."""
    if sum(len(frame) + 4 for frame in frames) > JOB_MESSAGE_MAX:
        return None
    return b"".join(_LENGTH.pack(len(frame)) + bytes(frame) for frame in frames)


def parse_job_message(data: bytes | memoryview) -> list[bytes]:
    frames, at, end = [], 0, len(data)
    while at < end:
        if at + 4 > end:
            raise ProtocolError("a job-socket message ends inside a frame's length")
        (size,) = _LENGTH.unpack_from(data, at)
        at += 4
        if at + size > end:
            raise ProtocolError("a job-socket message ends inside a frame")
        frames.append(bytes(data[at:at + size]))
        at += size
    return frames


def read_job_messages(conn: socket.socket, buffer: bytearray,
                      dropped: Callable[[ProtocolError], None]) -> Iterator[list[bytes] | None]:
    """The job messages waiting on a non-blocking SEQPACKET connection, each read when the one
    before it has been handled, until none waits; ``None`` last once the peer has gone. A
    malformed message goes to ``dropped`` and is skipped. Both ends of a job socket read so:
    the worker its leased batches, the frontend their answers."""
    while True:
        try:
            size = conn.recv_into(buffer)
        except BlockingIOError:
            return
        except OSError:
            size = 0
        if size == 0:
            yield None
            return
        try:
            frames = parse_job_message(memoryview(buffer)[:size])
        except ProtocolError as exc:
            dropped(exc)
            continue
        yield frames


def job_endpoint(backend: str, pid: int) -> str | None:
    """Where the worker with ``pid`` of the controller whose worker socket is ``backend`` binds
    its job socket (None off ``ipc://``: its workers are never lent)."""
    folder = run_dir_of(backend)
    return None if folder is None else f"ipc://{folder}/{JOB_SOCKET}{pid}.sock"


# -- leases: a frontend sends an idle worker requests itself ----------------------------------


@dataclass(frozen=True, slots=True)
class Lease:
    """Worker ``jobs`` of ``model`` ``version`` is the frontend's to send up to ``batch``
    requests at a time, requests naming no version too when it is the ``default``; a batch
    unanswered after ``timeout`` seconds (the version's response timeout) has hung. Under
    token authorization only requests whose token hashes (SHA-256) to ``key_digest`` may go,
    until ``key_expires`` (seconds since the epoch); the others go to the controller."""

    model: str
    version: str
    default: bool
    jobs: str
    batch: int
    timeout: float
    key_digest: bytes | None = None
    key_expires: float | None = None


def lease(grant: Lease) -> list[bytes]:
    return [LEASE, packb({"model": grant.model, "version": grant.version,
                          "default": grant.default, "jobs": grant.jobs, "batch": grant.batch,
                          "timeout": grant.timeout, "key": grant.key_digest,
                          "expires": grant.key_expires})]


def parse_lease(frame: bytes) -> Lease:
    info = unpackb(frame)
    if not (isinstance(info, dict) and isinstance(info.get("model"), str)
            and isinstance(info.get("version"), str) and isinstance(info.get("jobs"), str)
            and isinstance(info.get("batch"), int) and info["batch"] >= 1
            and isinstance(info.get("timeout"), (int, float)) and info["timeout"] > 0
            and (info.get("key") is None) == (info.get("expires") is None)
            and isinstance(info.get("key"), (bytes, type(None)))
            and isinstance(info.get("expires"), (int, float, type(None)))):
        raise ProtocolError("a LEASE header must be {model, version, default, jobs, batch, "
                            "timeout, key, expires}")
    expires = info.get("expires")
    return Lease(info["model"], info["version"], bool(info.get("default")), info["jobs"],
                 info["batch"], float(info["timeout"]), info.get("key"),
                 None if expires is None else float(expires))


def overdue(jobs: str) -> list[bytes]:
    """A frontend's word that the batch it sent the worker at ``jobs`` hung."""
    return [OVERDUE, jobs.encode()]


def recall() -> list[bytes]:
    return [RECALL]


def returned(used: bool) -> list[bytes]:
    """A recalled worker is idle again; ``used``: it ran leased batches since its last word."""
    return [RETURNED, b"1" if used else b""]


def revoke(jobs: str, lost: bool) -> list[bytes]:
    """The lease of the worker at ``jobs`` ends; ``lost``: the worker is gone too."""
    return [REVOKE, jobs.encode(), b"1" if lost else b""]


@dataclass(frozen=True, slots=True)
class Served:
    """A batch a frontend sent a worker on a lease: its answers (bodies empty when the
    worker ``delivered`` them itself), and the seconds it ``took`` in the worker."""

    fid: bytes
    delivered: bool
    took: float
    results: list[Result]


def served(batches: Iterable[Served]) -> list[bytes]:
    """A worker's word on the batches frontends sent it on a lease, several at once: heads
    only where it delivered the answers, whole (for the controller to forward) where not."""
    header, frames = [], [SERVED]
    for b in batches:
        header.append([b.fid, b.delivered, b.took, len(b.results)])
        for result in b.results:
            frames += [result.rid, result.head, b"" if b.delivered else result.body]
    frames.insert(1, packb(header))
    return frames


def parse_served(frames: Sequence[bytes]) -> list[Served]:
    """The batches of a SERVED message (without its kind frame)."""
    header = unpackb(frames[0]) if frames else None
    results = parse_results(frames[1:])
    if not isinstance(header, list):
        raise ProtocolError("a SERVED header must be a list of [fid, delivered, took, count]")
    batches, at = [], 0
    for entry in header:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], bytes)
                and isinstance(entry[2], (int, float)) and isinstance(entry[3], int)
                and 0 <= entry[3] <= len(results) - at):
            raise ProtocolError("a SERVED batch must be [fid, delivered, took, count]")
        fid, delivered, took, count = entry
        batches.append(Served(fid, bool(delivered), max(0.0, float(took)),
                              results[at:at + count]))
        at += count
    if at != len(results):
        raise ProtocolError("a SERVED message has answers no batch counts")
    return batches


# -- answers: DONE from a worker, REPLY and CHUNK to a frontend --------------------------------


@dataclass(frozen=True, slots=True)
class Head:
    """An answer's status, content type and headers: what HTTP sends before the body."""

    status: int
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)

    def pack(self) -> bytes:
        return packb([self.status, self.content_type, self.headers])

    @staticmethod
    def parse(frame: bytes) -> Head:
        fields = unpackb(frame)
        if not (isinstance(fields, list) and len(fields) == 3 and isinstance(fields[0], int)):
            raise ProtocolError("an answer's head must be [status, content_type, headers]")
        return Head(*fields)


def head(status: int, content_type: str = JSON, headers: dict[str, str] | None = None) -> bytes:
    """A packed :class:`Head`."""
    return packb([status, content_type, headers or {}])


@dataclass(frozen=True, slots=True)
class Result:
    """A request's answer on the wire; ``head`` stays packed, as the controller passes it on."""

    rid: bytes
    head: bytes
    body: bytes


def done(results: Iterable[Result]) -> list[bytes]:
    """A worker's answers to (some of) the requests it runs."""
    return _results(DONE, results)


def answered(results: Iterable[Result]) -> list[bytes]:
    """A worker's word that it sent these answers to their frontends itself: ids and heads,
    for the controller's bookkeeping, without the bodies."""
    frames = [ANSWERED]
    for result in results:
        frames += [result.rid, result.head]
    return frames


def parse_answered(frames: Sequence[bytes]) -> list[Result]:
    """The answers of an ANSWERED message (without its kind frame), bodies empty."""
    if len(frames) % 2:
        raise ProtocolError("an ANSWERED message must be rid, head pairs")
    return [Result(frames[i], frames[i + 1], b"") for i in range(0, len(frames), 2)]


def replies(results: Iterable[Result]) -> list[bytes]:
    """The final answers of one or more requests of one frontend, as one REPLY."""
    return _results(REPLY, results)


def chunks(parts: Iterable[Result]) -> list[bytes]:
    """Streamed parts of one or more requests, as one CHUNK; each request stays open until its
    final answer."""
    return _results(CHUNK, parts)


def _results(kind: bytes, results: Iterable[Result]) -> list[bytes]:
    frames = [kind]
    for result in results:
        frames += [result.rid, result.head, result.body]
    return frames


def parse_results(frames: Sequence[bytes]) -> list[Result]:
    """The results of a DONE, REPLY or CHUNK message (without its kind frame)."""
    if len(frames) % 3:
        raise ProtocolError("a DONE, REPLY or CHUNK message must be rid, head, body triples")
    return [Result(frames[i], frames[i + 1], frames[i + 2]) for i in range(0, len(frames), 3)]


def parse_result(frames: Sequence[bytes]) -> Result:
    """One answer, ``[rid, head, body]``, as a frontend's bridge hands it on."""
    if len(frames) != 3:
        raise ProtocolError("an answer must be rid, head, body")
    return Result(frames[0], frames[1], frames[2])


@dataclass(slots=True)
class Reply:
    """An answer as a frontend receives it, or as the controller's management verbs build it.

    ``body`` is bytes on the wire; a verb may give a str or a JSON-able value, encoded by
    :meth:`result`. A streamed answer has ``stream``: the bodies of the later parts, final one
    last; ``status``, ``content_type`` and ``headers`` are then those of the first part, and
    ``final_status`` that of the final answer once ``stream`` has yielded its body (a stream
    may fail after it began: a deadline, a worker that died); ``give_up()``, for a reader that
    stops early, read or not, cancels the request unless its answer has ended.
    """

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = JSON
    stream: Any = None
    final_status: int | None = None
    give_up: Any = None  # a streamed answer's: () -> None

    def body_bytes(self) -> bytes:
        body = self.body
        if isinstance(body, bytes):
            return body
        if isinstance(body, str):
            return body.encode()
        return json.dumps(body, indent=2).encode()

    def result(self, rid: bytes) -> Result:
        return Result(rid, head(self.status, self.content_type, self.headers), self.body_bytes())

    @classmethod
    def from_result(cls, result: Result, stream: Any = None) -> Reply:
        h = Head.parse(result.head)
        return cls(h.status, result.body, h.headers, h.content_type, stream)

    @classmethod
    def error(cls, exc: Any) -> Reply:
        """The answer to an :class:`mservd.errors.MservdError`."""
        return cls(exc.http_status, exc.to_body(), dict(exc.headers))


# -- MANAGE and CANCEL: a frontend's other calls ---------------------------------------------


@dataclass(frozen=True, slots=True)
class ManageCall:
    """A management verb (or a question such as ping) for the controller."""

    rid: bytes
    op: str
    args: dict[str, Any]
    token: str | None
    api: str = API_MANAGEMENT


def manage(call: ManageCall) -> list[bytes]:
    return [MANAGE, packb({"id": call.rid, "op": call.op, "args": call.args,
                          "token": call.token, "api": call.api})]


def parse_manage(frame: bytes) -> ManageCall:
    call = unpackb(frame)
    if not (isinstance(call, dict) and isinstance(call.get("id"), bytes)
            and isinstance(call.get("op"), str)):
        raise ProtocolError("a MANAGE header needs an id (bytes) and an op (str)")
    args = call.get("args") or {}
    if not isinstance(args, dict):
        raise ProtocolError("a MANAGE header's args must be a map")
    token = call.get("token")
    return ManageCall(call["id"], call["op"], args, token if isinstance(token, str) else None,
                      API_INFERENCE if call.get("api") == API_INFERENCE else API_MANAGEMENT)


def cancel(rid: bytes) -> list[bytes]:
    return [CANCEL, rid]


def stepped(firsts: Sequence[tuple[bytes, float]] = (), gaps: Sequence[float] = ()
            ) -> list[bytes]:
    """A continuous worker's word that its steps go on (``STEP_REPORT_INTERVAL``), with what
    it streamed to frontends itself since it last said so: when each stream's first part went
    (``time.monotonic()``, one clock for every process of the machine) and the gaps between
    later parts, for the controller's time-to-first-token and inter-token figures."""
    if not firsts and not gaps:
        return [STEPPED]
    return [STEPPED, packb([[[rid, at] for rid, at in firsts], list(gaps)])]


def parse_stepped(frames: Sequence[bytes]) -> tuple[list[tuple[bytes, float]], list[float]]:
    """A STEPPED message's first parts and gaps (without its kind frame)."""
    if not frames:
        return [], []
    try:
        firsts, gaps = unpackb(frames[0])
        return ([(rid, float(at)) for rid, at in firsts if isinstance(rid, bytes)],
                [float(gap) for gap in gaps])
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"a STEPPED message must be [[[rid, at], ...], [gap, ...]]: {exc}"
                            ) from exc


# -- a worker's life: READY, FAILED, METRICS, STOP ---------------------------------------------


def ready(pid: int, jobs: str | None = None) -> list[bytes]:
    """A worker loaded its model; ``jobs``: its job socket, where it takes leased batches."""
    return [READY, packb({"pid": pid, "jobs": jobs})]


def parse_ready(frame: bytes) -> str | None:
    """The job socket a READY names (None: the worker takes batches from the controller only)."""
    info = unpackb(frame)
    jobs = info.get("jobs") if isinstance(info, dict) else None
    return jobs if isinstance(jobs, str) else None


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """Why a worker could not load its model."""

    message: str
    traceback: str = ""


def failed(failure: LoadFailure) -> list[bytes]:
    return [FAILED, packb({"message": failure.message, "traceback": failure.traceback})]


def parse_failed(frame: bytes) -> LoadFailure:
    info = unpackb(frame)
    if not isinstance(info, dict):
        raise ProtocolError("a FAILED header must be a map")
    return LoadFailure(str(info.get("message", "")), str(info.get("traceback") or ""))


@dataclass(frozen=True, slots=True)
class Sample:
    """One metric a handler recorded (handlers.metrics), shipped to the controller."""

    name: str
    value: float
    unit: str
    kind: str
    dimensions: dict[str, str]


def metrics(samples: Iterable[Sample]) -> list[bytes]:
    return [METRICS, packb([[s.name, s.value, s.unit, s.kind, s.dimensions] for s in samples])]


def parse_metrics(frame: bytes) -> list[Sample]:
    rows = unpackb(frame)
    if not isinstance(rows, list):
        raise ProtocolError("a METRICS header must be an array")
    samples = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 5 and isinstance(row[4], dict)):
            raise ProtocolError("a metric must be [name, value, unit, kind, dimensions]")
        samples.append(Sample(str(row[0]), float(row[1]), str(row[2]), str(row[3]), row[4]))
    return samples


def stop() -> list[bytes]:
    return [STOP]
