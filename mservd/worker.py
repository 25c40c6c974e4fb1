"""The backend worker: one OS process serving one model version.

It loads the handler once (``initialize``), tells the controller it is ready (or why it could
not load, then exits with code 3), and then runs batches until told to stop. It knows its model,
its device and its socket, nothing else. A batch that raises fails only itself; the worker lives
on. The worker exits by itself when its parent (the zygote, which dies with the controller) goes
away: parent-death signal, and a ppid check each second, so no worker outlives its daemon.

The supervisor's zygote forks each worker and calls :func:`run` with the spec it was sent;
``python -m mservd.worker SPEC_JSON`` runs one in a fresh interpreter (for debugging a handler).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from typing import Any

import zmq

from mservd import kserve_v1, protocol
from mservd.errors import error_body
from mservd.lifeline import die_with_parent, parent_changed
from mservd.log_format import formatter, log_to_stderr
from mservd.payload import InputError, decode_form, decode_input, encode_output, is_form
from mservd.v2 import handling as v2
from mservd.v2 import metadata as v2_metadata
from mservd.v2.codec import V2Error

log = logging.getLogger("mservd.worker")

EXIT_LOAD_FAILED = 3
POLL_MS = 1000
METRICS_INTERVAL = 1.0  # seconds between shipments of handler metrics to the controller


class TaggedStream:
    """stdout/stderr for handler code: each line says which worker and which requests wrote it.

    The model's log then ties a handler's ``print`` to the request ids of the batch it ran in.
    With ``log_format=json`` each line becomes a record like the worker's own log lines (logger
    ``handler``, its request ids a list), so a log shipper reads the whole file one way.
    """

    def __init__(self, stream, pid: int, log_format: str = "plain",
                 level: int = logging.INFO) -> None:
        self._stream = stream
        self._prefix = f"[pid {pid}] "
        self.requests = ""
        self._line_start = True
        self._json = formatter(log_format) if log_format == "json" else None
        self._level = level
        self._partial = ""  # json: the start of a line not yet ended

    def write(self, text: str) -> int:
        if not text:
            return 0
        if self._json is not None:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
            self._stream.write("".join(self._record(line) for line in lines if line))
            return len(text)
        tag = self._prefix + (f"[requests {self.requests}] " if self.requests else "")
        lines = text.split("\n")
        out = []
        for i, line in enumerate(lines):
            if line and (self._line_start or i > 0):
                out.append(tag)
            out.append(line)
            if i < len(lines) - 1:
                out.append("\n")
        self._line_start = text.endswith("\n")
        self._stream.write("".join(out))
        return len(text)

    def _record(self, line: str) -> str:
        record = logging.makeLogRecord({
            "name": "handler", "levelno": self._level,
            "levelname": logging.getLevelName(self._level), "msg": line,
            "requests": self.requests.split(",") if self.requests else []})
        return self._json.format(record) + "\n"

    def flush(self) -> None:
        if self._partial:  # json: a line flushed before its end is a record of its own
            self._stream.write(self._record(self._partial))
            self._partial = ""
        self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already set by an earlier parallel op


def load(spec: dict[str, Any]):
    """Build the Context and the initialised handler described by the controller's spec."""
    from handlers.context import Context
    from handlers.loader import load_handler
    from handlers.ts_compat import install_ts_aliases

    install_ts_aliases()  # handlers written for TorchServe import ts.*

    context = Context(
        spec["model_name"],
        spec["model_dir"],
        spec["manifest"],
        spec["batch_size"],
        spec["gpu_id"],
        spec.get("server_version", "mservd"),
        limit_max_image_pixels=spec.get("limit_max_image_pixels", True),
        model_yaml_config=spec.get("model_yaml") or {},
    )
    if spec.get("install_py_dep_per_model"):
        install_model_requirements(spec["model_dir"], spec.get("manifest") or {})
    handler = load_handler(spec["model_dir"], spec["handler"])
    handler.initialize(context)
    return handler, context


DEPS_DIR = ".deps"
PIP_TIMEOUT = 300.0  # seconds; a pip that hangs fails the load with its output so far


class RequirementsError(Exception):
    """pip could not install the archive's requirements file."""


def install_model_requirements(model_dir: str, manifest: dict[str, Any]) -> str | None:
    """``pip install --target <model_dir>/.deps -r <requirementsFile>`` (install_py_dep_per_model).

    TorchServe's per-model dependencies: the folder goes first on ``sys.path``. Workers of one
    model share it; a lock serialises them and a marker skips a second install.
    """
    req = (manifest.get("model") or {}).get("requirementsFile")
    if not req:
        return None
    import fcntl
    import hashlib
    import subprocess

    req_path = os.path.join(model_dir, req)
    if not os.path.isfile(req_path):
        raise RequirementsError(f"The archive names requirementsFile {req!r}, but "
                                f"{req_path} does not exist.")
    target = os.path.join(model_dir, DEPS_DIR)
    with open(req_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    marker = os.path.join(target, ".mservd-installed")
    with open(os.path.join(model_dir, DEPS_DIR + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = False
        if os.path.isfile(marker):
            with open(marker) as f:
                done = f.read() == digest
        if not done:
            cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
                   "--no-input", "--target", target, "-r", req_path]
            log.info("installing %s: %s", req, " ".join(cmd))
            try:
                proc = subprocess.run(cmd, cwd=model_dir, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT, check=False)
            except subprocess.TimeoutExpired as exc:
                out = (exc.stdout or b"").decode(errors="replace")
                raise RequirementsError(f"pip install -r {req} did not finish within "
                                        f"{PIP_TIMEOUT:.0f} s:\n{out[-4000:]}") from None
            out = proc.stdout.decode(errors="replace")
            if proc.returncode != 0:
                raise RequirementsError(f"pip install -r {req} failed (exit code "
                                        f"{proc.returncode}):\n{out[-4000:]}")
            log.info("pip output:\n%s", out[-2000:])
            with open(marker, "w") as f:
                f.write(digest)
    if target not in sys.path:
        sys.path.insert(0, target)
    return target


def attach_stream(context, sock, max_response_size: int) -> None:
    """Let the handler stream: ``send_intermediate`` sends one CHUNK for a request at once.

    Set once per worker; a plain batch pays nothing for it. The chunk is encoded like a final
    answer (status, content type and headers as the handler set them).
    """
    def send_chunk(idx: int, item: Any) -> None:
        rid = context.request_ids[idx].encode()
        sock.send_multipart([protocol.CHUNK, rid,
                             *_encode_answer(context, idx, item, max_response_size)])

    context.stream_callback = send_chunk


def run_batch(handler, context, frames: list[bytes], max_response_size: int) -> list[bytes]:
    """Run one BATCH message through the handler; the DONE message's frames, one answer each.

    A request is normally one row of the handler's batch; a KServe V1 request is one row per
    instance. A request whose body cannot be decoded is answered at once and left out.
    """
    out = [protocol.DONE]
    requests = []  # the requests that reach the handler
    spans: list[tuple[int, int, bool]] = []  # per request: first row, row count, is V1
    data: list[dict[str, Any]] = []
    v2_calls: list[Any] = []  # per row: its V2Call, or None
    row_ids: list[str] = []
    row_headers: list[dict[str, str]] = []
    for req in protocol.parse_batch(frames):
        try:
            rows, calls, is_v1 = _decode_request(req, context)
        except Exception as exc:  # whatever a request's bytes raise, it fails that request alone
            out += [req.rid, *_undecodable(req, exc)]
            continue
        requests.append(req)
        spans.append((len(data), len(rows), is_v1))
        data.extend(rows)
        v2_calls.extend(calls)
        row_ids.extend([req.rid.decode()] * len(rows))
        row_headers.extend([req.headers] * len(rows))
    if not requests:
        return out
    context.v2_requests = v2_calls  # read by handlers.v2.v2_inputs
    ids = [r.rid.decode() for r in requests]
    context.begin_batch(row_ids, row_headers)
    _tag_output(",".join(ids))
    try:
        outputs = handler.handle(data, context)
        if not isinstance(outputs, (list, tuple)) or len(outputs) != len(data):
            got = len(outputs) if isinstance(outputs, (list, tuple)) else type(outputs).__name__
            raise BatchShapeError(
                f"Handler returned {got} outputs for a batch of {len(data)} requests; "
                "handle() must return a list with one item per request."
            )
    except (Exception, SystemExit) as exc:  # the handler's failure fails this batch only
        status, type_, message = _describe_failure(exc)
        log.error("batch of requests %s failed (%s): %s", ",".join(ids), type_, message,
                  exc_info=True)
        reply = protocol.pack_reply(status, "application/json")
        body = error_body(status, type_, message)
        for req in requests:
            out += [req.rid, reply, body]
        return out

    for req, (first, count, is_v1) in zip(requests, spans):
        if is_v1:
            out += [req.rid, *_encode_v1_answer(outputs[first:first + count], max_response_size)]
        elif v2_calls[first] is not None:
            out += [req.rid, *_encode_v2_answer(context, v2_calls[first], outputs[first],
                                                max_response_size)]
        else:
            out += [req.rid, *_encode_answer(context, first, outputs[first], max_response_size)]
    return out


def _decode_request(req, context) -> tuple[list[dict[str, Any]], list[Any], bool]:
    """The handler rows of one request, their v2 calls, and whether it is KServe V1.

    :raises Exception: whatever the request's bytes raise; :func:`_undecodable` answers it.
    """
    content_type = req.inputs[0][1] if len(req.inputs) == 1 else ""
    if content_type.startswith(v2.CONTENT_TYPE):
        row, call = v2.decode_row(content_type, req.payloads[0], _v2_meta(context))
        return [row], [call], False
    if content_type == kserve_v1.CONTENT_TYPE:
        rows = kserve_v1.decode_rows(req.payloads[0],
                                     context.system_properties.get("batch_size") or 1)
        return rows, [None] * len(rows), True
    row = {}
    for (name, input_type), payload in zip(req.inputs, req.payloads):
        if is_form(input_type):  # one input per field, by field name
            for field, field_type, data in decode_form(input_type, payload):
                row[field] = decode_input(field_type, data)
        else:
            row[name] = decode_input(input_type, payload)
    return [row], [None], False


def _undecodable(req, exc: Exception) -> list[bytes]:
    """The 400 answer to a request whose inputs cannot be decoded, in its protocol's shape:
    the decoders' own errors say what is wrong; anything else is named with its type."""
    if isinstance(exc, (InputError, kserve_v1.V1Error, V2Error)):
        message = str(exc)
    else:
        message = f"The request's input cannot be decoded: {type(exc).__name__}: {exc}"
    log.warning("request %s refused: %s", req.rid.decode(errors="replace"), message)
    content_type = req.inputs[0][1] if len(req.inputs) == 1 else ""
    if content_type == kserve_v1.CONTENT_TYPE:
        body = kserve_v1.error_answer(message)
    elif content_type.startswith(v2.CONTENT_TYPE):
        body = v2.error_answer(message)
    else:
        body = error_body(400, "BadRequestException", message)
    return [protocol.pack_reply(400, "application/json"), body]


def _encode_v1_answer(items: list[Any], max_response_size: int) -> list[bytes]:
    """A KServe V1 answer: the instances' predictions, or the first instance's error."""
    from handlers.errors import RequestError

    for item in items:
        if isinstance(item, RequestError):
            return [protocol.pack_reply(item.status, "application/json"),
                    kserve_v1.error_answer(item.message)]
    try:
        body = kserve_v1.encode_predictions(items)
    except Exception as exc:  # TypeError, ValueError, RecursionError, a tolist() that raises
        return [protocol.pack_reply(500, "application/json"),
                kserve_v1.error_answer(f"The predictions cannot be encoded: {exc}")]
    if len(body) > max_response_size:
        return [protocol.pack_reply(500, "application/json"), kserve_v1.error_answer(
            f"Response of {len(body)} bytes exceeds max_response_size ({max_response_size}).")]
    return [protocol.pack_reply(200, "application/json"), body]


def _tag_output(requests: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, TaggedStream):
            stream.requests = requests


def ship_metrics(sock, context) -> None:
    """Send the handler's recorded metrics to the controller, which owns /metrics."""
    recorder = getattr(context, "metrics", None)
    samples = recorder.drain() if recorder is not None and hasattr(recorder, "drain") else []
    if samples:
        sock.send_multipart([protocol.METRICS, protocol.packb(
            [[m.name, float(m.value), m.unit, getattr(m.kind, "value", str(m.kind)),
              dict(m.dimensions)] for m in samples])])


def _v2_meta(context):
    """The model's v2 metadata (model-config.yaml ``v2:``), read once per worker."""
    meta = getattr(context, "_v2_metadata", None)
    if meta is None:
        meta = context._v2_metadata = v2_metadata.from_model_yaml(context.model_yaml_config)
    return meta


def _encode_v2_answer(context, call, item: Any, max_response_size: int) -> list[bytes]:
    """A v2 request's answer: the infer response, or ``{"error": ...}`` with its status."""
    from handlers.errors import RequestError

    if isinstance(item, RequestError):
        return [protocol.pack_reply(item.status, "application/json"),
                v2.error_answer(item.message)]
    try:
        body, content_type, headers = v2.encode_answer(
            call, item, _v2_meta(context), context.model_name,
            str(context.manifest.get("model", {}).get("modelVersion", "")))
    except Exception as exc:  # V2Error, or whatever the handler's value raises on the way
        message = str(exc) if isinstance(exc, V2Error) else f"{type(exc).__name__}: {exc}"
        log.error("v2 answer for model %s cannot be encoded: %s", context.model_name, message)
        return [protocol.pack_reply(500, "application/json"), v2.error_answer(message)]
    if len(body) > max_response_size:
        return [protocol.pack_reply(500, "application/json"), v2.error_answer(
            f"Response of {len(body)} bytes exceeds max_response_size ({max_response_size}).")]
    return [protocol.pack_reply(200, content_type, headers), body]


def _failed_batch(frames: list[bytes], exc: Exception) -> list[bytes] | None:
    """A DONE message answering every request of a batch 500; None if it cannot be read."""
    try:
        requests = protocol.parse_batch(frames)
    except Exception:  # the controller times the batch out and answers it
        log.exception("worker dropped a batch it cannot read")
        return None
    reply = protocol.pack_reply(500, "application/json")
    body = error_body(500, "InternalServerException",
                      f"The worker failed this batch: {type(exc).__name__}: {exc}")
    out = [protocol.DONE]
    for req in requests:
        out += [req.rid, reply, body]
    return out


class BatchShapeError(Exception):
    """The handler broke the contract: one output per request."""


def _describe_failure(exc: BaseException) -> tuple[int, str, str]:
    """Status, type and message of a failed batch: the handler's own code when it gave one."""
    message = getattr(exc, "message", None) or str(exc)
    code = getattr(exc, "error_code", None)
    if isinstance(exc, BatchShapeError):
        return 500, "InternalServerException", message
    if isinstance(code, int) and 400 <= code <= 599:
        return code, type(exc).__name__, message
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return 507, "OutOfMemory", f"{type(exc).__name__}: {message}"
    return 500, "InternalServerException", f"{type(exc).__name__}: {message}"


def _encode_answer(context, idx: int, item: Any, max_response_size: int) -> list[bytes]:
    from handlers.errors import RequestError

    if isinstance(item, RequestError):
        return [protocol.pack_reply(item.status, "application/json"),
                error_body(item.status, item.type, item.message)]
    meta = context.response_meta(idx)
    try:
        body, content_type = encode_output(item, meta.content_type)
    except Exception as exc:  # TypeError, ValueError, RecursionError, a tolist() that raises
        message = f"Handler output for request {idx} cannot be encoded: {exc}"
        log.error(message)
        return [protocol.pack_reply(500, "application/json"),
                error_body(500, "InternalServerException", message)]
    if len(body) > max_response_size:
        message = (f"Response of {len(body)} bytes exceeds max_response_size "
                   f"({max_response_size}).")
        return [protocol.pack_reply(500, "application/json"),
                error_body(500, "InternalServerException", message)]
    status = meta.status or 200
    return [protocol.pack_reply(status, content_type, meta.headers or None), body]


def serve(spec: dict[str, Any]) -> int:
    parent = os.getppid()
    zctx = zmq.Context()
    sock = zctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, spec["worker_id"].encode())
    sock.connect(spec["endpoint"])
    began = time.monotonic()
    try:
        handler, context = load(spec)
    except BaseException as exc:  # any load failure must reach the register call
        tb = traceback.format_exc()
        log.error("loading %s failed:\n%s", spec["model_name"], tb)
        message = f"{type(exc).__name__}: {exc}"
        sock.send_multipart([protocol.FAILED, protocol.packb({"message": message, "traceback": tb})])
        time.sleep(0.2)  # let the message leave before the context goes
        sock.close(linger=1000)
        return EXIT_LOAD_FAILED
    sock.send_multipart([protocol.READY, protocol.packb({"pid": os.getpid()})])
    log.info("worker %s ready: model %s version %s loaded in %.2f s", spec["worker_id"],
             spec["model_name"], spec["version"], time.monotonic() - began)
    max_response_size = spec.get("max_response_size", 6553500)
    attach_stream(context, sock, max_response_size)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    shipped = time.monotonic()
    while True:
        if not poller.poll(POLL_MS):
            if parent_changed(parent):
                log.warning("controller is gone; worker %s exits", spec["worker_id"])
                return 0
            ship_metrics(sock, context)
            continue
        frames = sock.recv_multipart()
        kind = frames[0]
        if kind == protocol.STOP:
            log.info("worker %s stopping", spec["worker_id"])
            return 0
        if kind != protocol.BATCH:
            log.error("worker dropped a message of kind %r", kind[:8])
            continue
        try:
            reply = run_batch(handler, context, frames[1:], max_response_size)
        except protocol.ProtocolError as exc:
            log.error("worker dropped a malformed batch: %s", exc)
            continue
        except Exception as exc:  # a bug of ours: the batch fails, the worker lives on
            log.exception("batch failed outside the handler")
            reply = _failed_batch(frames[1:], exc)
            if reply is None:
                continue
        finally:
            _tag_output("")
        sock.send_multipart(reply)
        if time.monotonic() - shipped >= METRICS_INTERVAL:
            shipped = time.monotonic()
            ship_metrics(sock, context)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run(json.loads(argv[0]))


def run(spec: dict[str, Any]) -> int:
    """Be the worker ``spec`` describes, in this process (a fresh one or a zygote's fork)."""
    log_to_stderr(spec.get("log_level", "INFO"), spec.get("log_format", "plain"))
    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the daemon, which stops us
    log_format = spec.get("log_format", "plain")
    sys.stdout = TaggedStream(sys.stdout, os.getpid(), log_format)
    sys.stderr = TaggedStream(sys.stderr, os.getpid(), log_format, logging.WARNING)
    _set_threads(spec.get("threads"))
    if spec.get("model_dir") and spec["model_dir"] not in sys.path:
        sys.path.insert(0, spec["model_dir"])
    return serve(spec)


if __name__ == "__main__":
    sys.exit(main())
