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

import contextlib
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Container
from typing import Any

import zmq

from mservd import codecs, protocol
from mservd.codecs import CODECS, Call
from mservd.continuous import serve_continuous
from mservd.cores import Threads
from mservd.frontend_links import FrontendLinks
from mservd.lifeline import EXIT_LOAD_FAILED, die_with_parent, parent_changed
from mservd.log_format import formatter, log_to_stderr
from mservd.specs import WorkerSpec

log = logging.getLogger("mservd.worker")
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)  # no enum math
POLL_MS = 1000
LINK_WAIT = 1.0  # seconds a leased batch's answer waits for its frontend's connection
LEASED_PER_TURN = 8  # leased batches run before the controller's socket is read again
SERVED_WAIT = 0.001  # seconds a worker with nothing to do waits before it reports leased
SERVED_EVERY = 0.01  # ... batches to the controller, and at most this late while busy: one
# wake-up of the controller per report, not per request
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
    """Every core for loading; batch by batch, the worker's share of them (``Threads``)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already set by an earlier parallel op


def load(spec: WorkerSpec):
    """Build the Context and the initialised handler described by the controller's spec."""
    from handlers.context import Context
    from handlers.loader import load_handler
    from handlers.ts_compat import install_ts_aliases

    install_ts_aliases()  # handlers written for TorchServe import ts.*
    # TorchServe tells its workers so; a handler may read it
    os.environ["TS_DECODE_INPUT_REQUEST"] = "true" if spec.decode_input_request else "false"

    from handlers.metrics import MetricsRecorder

    context = Context(
        spec.model_name,
        spec.model_dir,
        spec.manifest,
        spec.batch_size,
        spec.gpu_id,
        spec.server_version,
        limit_max_image_pixels=spec.limit_max_image_pixels,
        metrics=MetricsRecorder(spec.model_name, spec.model_metrics),
        model_yaml_config=spec.model_yaml or {},
    )
    context.decode_input_request = spec.decode_input_request  # read by the TorchServe codec
    if spec.install_py_dep_per_model:
        install_model_requirements(spec.model_dir, spec.manifest or {})
    handler = load_handler(spec.model_dir, spec.handler)
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


class ChunkRoute:
    """Where the running batch's streamed parts go: to the controller, which forwards them
    (each such request goes into ``streamed``: its final answer must follow the parts there),
    or, for a batch a frontend sent on a lease (``leased_to``), straight to that frontend."""

    def __init__(self, sock, links: FrontendLinks | None = None) -> None:
        self.sock = sock
        self.links = links
        self.leased_to: bytes | None = None
        self.streamed: set[bytes] = set()

    def send(self, part: protocol.Result) -> None:
        if self.leased_to is not None and self.links is not None:
            if not self.links.send(self.leased_to, protocol.chunks([part]), LINK_WAIT):
                log.warning("a streamed part of request %s could not reach its frontend",
                            part.rid.decode(errors="replace"))
            return
        self.streamed.add(part.rid)
        self.sock.send_multipart(protocol.chunks([part]))


def attach_stream(context, route: ChunkRoute, max_response_size: int) -> None:
    """Let the handler stream: ``send_intermediate`` sends one CHUNK for a request at once.

    Set once per worker; a plain batch pays nothing for it. The chunk is encoded like a final
    answer of its request's protocol.
    """
    def send_chunk(idx: int, item: Any) -> None:
        call, codec = context.calls[idx]
        rid = context.request_ids[idx].encode()
        part = codec.encode_part(Call(call.rows, idx, call.state), item, context,
                                 max_response_size)
        if part is not None:
            route.send(protocol.Result(rid, *part))

    context.stream_callback = send_chunk


def answer_batch(handler, context, requests: list[protocol.Request], max_response_size: int,
                 raise_failure: bool = False) -> list[protocol.Result]:
    """Run a batch's requests through the handler; one answer per request.

    Each request's codec turns it into rows of the handler's batch and the handler's outputs
    for those rows into its answer. A request whose payload cannot be decoded is answered 400
    at once and left out; a handler that fails fails its batch only (``raise_failure``: its
    exception is raised instead, for ``mservd run-handler`` to show).
    """
    running, results = codecs.decode(requests, context)
    rows: list[dict[str, Any]] = []
    for _, _, call in running:
        call.first = len(rows)
        rows.extend(call.rows)
    if not running:
        return results
    context.calls = [(call, codec) for _, codec, call in running for _ in call.rows]
    context.v2_requests = [call.state if codec is CODECS[protocol.CODEC_V2] else None
                           for call, codec in context.calls]  # read by handlers.v2
    row_ids, row_headers = [], []
    for request, _, call in running:
        headers = request.handler_headers()
        row_ids.extend([request.rid.decode()] * len(call.rows))
        row_headers.extend([headers] * len(call.rows))
    ids = ",".join(request.rid.decode() for request, _, _ in running)
    context.begin_batch(row_ids, row_headers)
    # a stateful model's sequence id goes back to the client, so that one that named none can
    # go on with it (the handler may set the header to another)
    for request, _, call in running:
        sequence = (request.server_headers or {}).get(protocol.SEQUENCE_ID)
        if sequence is not None:
            context.set_response_header(call.first, protocol.SEQUENCE_ID, sequence)
    _tag_output(ids)
    try:
        outputs = handler.handle(rows, context)
        if not isinstance(outputs, (list, tuple)) or len(outputs) != len(rows):
            got = len(outputs) if isinstance(outputs, (list, tuple)) else type(outputs).__name__
            raise BatchShapeError(
                f"Handler returned {got} outputs for a batch of {len(rows)} requests; "
                "handle() must return a list with one item per request."
            )
    except (Exception, SystemExit) as exc:  # the handler's failure fails this batch only
        if raise_failure:
            raise
        status, type_, message = _describe_failure(exc)
        log.error("batch of requests %s failed (%s): %s", ids, type_, message, exc_info=True)
        for request, codec, _ in running:
            results.append(protocol.Result(request.rid, *codec.error(status, type_, message)))
        return results
    for request, codec, call in running:
        mine = list(outputs[call.first:call.first + len(call.rows)])
        results.append(protocol.Result(request.rid,
                                       *codec.encode(call, mine, context, max_response_size)))
    return results


def _tag_output(requests: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, TaggedStream):
            stream.requests = requests


def ship_metrics(sock, context) -> None:
    """Send the handler's recorded metrics to the controller, which owns /metrics, with the
    device memory this worker holds when it runs on a GPU."""
    recorder = getattr(context, "metrics", None)
    samples = [protocol.Sample(m.name, float(m.value), m.unit,
                               getattr(m.kind, "value", str(m.kind)), dict(m.dimensions))
               for m in (recorder.drain() if recorder is not None and hasattr(recorder, "drain")
                         else [])]
    device = device_memory(context)
    if device is not None:
        samples.append(protocol.Sample(protocol.DEVICE_MEMORY, float(device), "Bytes", "gauge",
                                       {}))
    if samples:
        sock.send_multipart(protocol.metrics(samples))


def device_memory(context) -> int | None:
    """Bytes PyTorch's allocator holds on this worker's GPU (None on the CPU)."""
    gpu_id = (getattr(context, "system_properties", None) or {}).get("gpu_id")
    torch = sys.modules.get("torch")
    if gpu_id is None or torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.memory_reserved(int(gpu_id)))


def _failed_batch(frames: list[bytes], exc: Exception) -> list[bytes] | None:
    """A DONE message answering every request of a batch 500; None if it cannot be read."""
    try:
        requests = protocol.parse_batch(frames)
    except Exception:  # the controller times the batch out and answers it
        log.exception("worker dropped a batch it cannot read")
        return None
    message = f"The worker failed this batch: {type(exc).__name__}: {exc}"
    return protocol.done(
        protocol.Result(r.rid, *CODECS[r.codec].error(500, "InternalServerException", message))
        for r in requests)


class BatchShapeError(Exception):
    """The handler broke the contract: one output per request."""


def _describe_failure(exc: BaseException) -> tuple[int, str, str]:
    """Status, type and message of a failed batch: the handler's own code when it gave one,
    typed ``InternalServerException`` as TorchServe types every error its handlers raise."""
    message = getattr(exc, "message", None) or str(exc)
    code = getattr(exc, "error_code", None)
    if isinstance(exc, BatchShapeError):
        return 500, "InternalServerException", message
    if isinstance(code, int) and 400 <= code <= 599:
        return code, "InternalServerException", message
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return 507, "OutOfMemory", f"{type(exc).__name__}: {message}"
    return 500, "InternalServerException", f"{type(exc).__name__}: {message}"


class JobSocket:
    """A worker's job socket (``leases.py``): a Unix ``SOCK_SEQPACKET`` listener in the run
    folder, with a connection from each frontend the worker was lent to; each message on one
    is a leased BATCH (:func:`protocol.job_message`), answered on the same connection."""

    def __init__(self, listener: socket.socket, endpoint: str) -> None:
        self.listener = listener
        self.endpoint = endpoint
        self.conns: dict[int, socket.socket] = {}
        self.buffer = bytearray(protocol.JOB_MESSAGE_MAX)

    @classmethod
    def bind(cls, backend: str) -> JobSocket | None:
        """None where there is none (not ``ipc://``, or the bind fails): the worker is then
        never lent."""
        endpoint = protocol.job_endpoint(backend, os.getpid())
        if endpoint is None:
            return None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(endpoint[len("ipc://"):])
            listener.listen(64)
        except OSError as exc:
            log.warning("no job socket at %s (%s): this worker is never lent", endpoint, exc)
            listener.close()
            return None
        listener.setblocking(False)
        return cls(listener, endpoint)

    def run(self, batches: Batches, poller: zmq.Poller, ready: Container[Any] | None,
            limit: int | None) -> None:
        """Take new connections and run the leased batches waiting on those ``ready`` (file
        descriptors), up to ``limit`` each; ``ready`` None: every batch on every connection
        (a RECALL or STOP: those sent before the lease ended)."""
        if ready is None or self.listener.fileno() in ready:
            while True:
                try:
                    conn, _ = self.listener.accept()
                except OSError:  # none waiting
                    break
                conn.setblocking(False)
                self.conns[conn.fileno()] = conn
                poller.register(conn, zmq.POLLIN)
        for fd, conn in list(self.conns.items()):
            if ready is None or fd in ready:
                self._read(fd, conn, batches, poller, limit)

    def _read(self, fd: int, conn: socket.socket, batches: Batches, poller: zmq.Poller,
              limit: int | None) -> None:
        done = 0
        while limit is None or done < limit:
            try:
                size = conn.recv_into(self.buffer)
            except BlockingIOError:
                return
            except OSError:
                size = 0
            if size == 0:  # the frontend went
                poller.unregister(conn)
                del self.conns[fd]
                conn.close()
                return
            try:
                frames = protocol.parse_job_message(memoryview(self.buffer)[:size])
            except protocol.ProtocolError as exc:
                log.error("worker dropped a malformed leased message: %s", exc)
                continue
            batches.leased(frames, conn)
            done += 1

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.endpoint[len("ipc://"):])


class Batches:
    """Runs the batches a serving worker gets, from the controller or on a lease, and sends
    their answers where they go."""

    def __init__(self, sock, handler, context, links: FrontendLinks, max_response_size: int,
                 threads: Threads) -> None:
        self.sock = sock
        self.handler = handler
        self.context = context
        self.links = links
        self.max_response_size = max_response_size
        self.threads = threads
        self.chunks = ChunkRoute(sock, links)
        attach_stream(context, self.chunks, max_response_size)
        self.tally: list[protocol.Served] = []  # leased batches not yet reported
        self.tally_since = 0.0
        # leased batches run since the controller last recalled this worker or sent it a
        # batch: a lease ended by a revoke (a new default, a rotated key) left it in use
        self.leased_since_ours = 0

    def report(self) -> None:
        """Tell the controller of the leased batches answered since the last report."""
        if self.tally:
            tally, self.tally = self.tally, []
            self.sock.send_multipart(protocol.served(tally))

    def report_by(self) -> float | None:
        """When the tally must go, at the latest (None: nothing to report)."""
        return self.tally_since + SERVED_EVERY if self.tally else None

    def from_controller(self, frames: list[bytes]) -> None:
        """A BATCH the controller sent: answered straight to the frontends that asked when
        they all can take it now, the controller told first (ANSWERED: it then knows this
        worker is free before any client has its answer), else through the controller (DONE)."""
        self.leased_since_ours = 0
        try:
            requests = protocol.parse_batch(frames[1:])
            results = self._run(requests, None)
            direct = self.links.reachable(requests, results, self.chunks.streamed)
        except protocol.ProtocolError as exc:
            log.error("worker dropped a malformed batch: %s", exc)
            return
        except Exception as exc:  # a bug of ours: the batch fails, the worker lives on
            log.exception("batch failed outside the handler")
            failed = _failed_batch(frames[1:], exc)
            if failed is not None:
                self.sock.send_multipart(failed)
            return
        if direct is None:
            self.sock.send_multipart(protocol.done(results))
            return
        self.sock.send_multipart(protocol.answered(results))
        self.links.send_reachable(direct)

    def leased(self, frames: list[bytes], conn: socket.socket | None = None) -> None:
        """A BATCH a frontend sent on its lease (on ``conn``): answered to it directly, on
        ``conn`` when the answer fits in a job message and nothing of it was streamed, else on
        its reply socket; then counted by the controller (SERVED), which forwards the answers
        only if they could not go."""
        began = time.monotonic()
        if not frames or frames[0] != protocol.BATCH:
            log.error("worker dropped a leased message of kind %r", frames[0][:8] if frames
                      else b"")
            return
        try:
            requests = protocol.parse_batch(frames[1:])
        except protocol.ProtocolError as exc:
            log.error("worker dropped a malformed leased batch: %s", exc)
            return
        fid = requests[0].fid if requests else b""
        if not requests or any(r.fid != fid for r in requests):
            log.error("worker dropped a leased batch not from one frontend")
            return
        try:
            results = self._run(requests, fid)
        except Exception as exc:  # a bug of ours: the batch fails, the worker lives on
            log.exception("leased batch failed outside the handler")
            failed = _failed_batch(frames[1:], exc)
            if failed is None:
                return
            results = protocol.parse_results(failed[1:])
        delivered = False
        if conn is not None and not self.chunks.streamed:
            reply = protocol.job_message(protocol.replies(results))
            if reply is not None:
                try:
                    conn.send(reply)
                    delivered = True
                except OSError:  # its buffer is full, or the frontend went: the ZeroMQ way
                    pass
        if not delivered:
            delivered = self.links.deliver(requests, results, wait=LINK_WAIT)
        self.leased_since_ours += 1
        if not self.tally:
            self.tally_since = began
        kept = results if not delivered else [protocol.Result(r.rid, r.head, b"") for r in results]
        self.tally.append(protocol.Served(fid, delivered, time.monotonic() - began, kept))
        if not delivered:  # the controller forwards these: at once
            self.report()

    def _run(self, requests: list[protocol.Request], leased_to: bytes | None
             ) -> list[protocol.Result]:
        self.chunks.streamed.clear()
        self.chunks.leased_to = leased_to
        try:
            with self.threads.batch():
                return answer_batch(self.handler, self.context, requests,
                                    self.max_response_size)
        finally:
            _tag_output("")
            self.chunks.leased_to = None


def serve(spec: WorkerSpec) -> int:
    parent = os.getppid()
    zctx = zmq.Context()
    sock = zctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, spec.worker_id.encode())
    sock.connect(spec.endpoint)
    began = time.monotonic()
    try:
        handler, context = load(spec)
    except BaseException as exc:  # any load failure must reach the register call
        tb = traceback.format_exc()
        log.error("loading %s failed:\n%s", spec.model_name, tb)
        sock.send_multipart(protocol.failed(protocol.LoadFailure(f"{type(exc).__name__}: {exc}",
                                                                 tb)))
        time.sleep(0.2)  # let the message leave before the context goes
        sock.close(linger=1000)
        return EXIT_LOAD_FAILED
    threads = Threads(spec.threads)
    links = FrontendLinks(zctx, spec.endpoint)
    batches = Batches(sock, handler, context, links, spec.max_response_size, threads)
    if spec.continuous_batching:  # the model's settings say so: the scheduler agrees
        sock.send_multipart(protocol.ready(os.getpid()))
        _log_ready(spec, began)
        return serve_continuous(sock, handler, context, spec.worker_id, parent,
                                spec.max_response_size, ship_metrics, threads)
    jobs = JobSocket.bind(spec.endpoint) if spec.lendable else None
    sock.send_multipart(protocol.ready(os.getpid(), None if jobs is None else jobs.endpoint))
    _log_ready(spec, began)
    try:
        return _serve_batches(spec, sock, jobs, batches, parent)
    finally:
        if jobs is not None:
            jobs.close()


def _log_ready(spec: WorkerSpec, began: float) -> None:
    log.info("worker %s ready: model %s version %s loaded in %.2f s", spec.worker_id,
             spec.model_name, spec.version, time.monotonic() - began)


def _serve_batches(spec: WorkerSpec, sock, jobs: JobSocket | None, batches: Batches,
                   parent: int) -> int:
    """Batches from the controller and, when lent, from a frontend, until told to stop."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if jobs is not None:
        poller.register(jobs.listener, zmq.POLLIN)
    shipped = time.monotonic()
    while True:
        report_by = batches.report_by()
        wait = POLL_MS if report_by is None else max(
            0.0, min(SERVED_WAIT, report_by - time.monotonic())) * 1000.0
        ready = dict(poller.poll(wait))
        if report_by is not None and (not ready or time.monotonic() >= report_by):
            batches.report()
        if not ready:
            if report_by is not None:
                continue
            if parent_changed(parent):
                log.warning("controller is gone; worker %s exits", spec.worker_id)
                return 0
            ship_metrics(sock, batches.context)
            continue
        if sock in ready:
            frames = sock.recv_multipart()
            kind = frames[0]
            if kind == protocol.STOP:
                if jobs is not None:  # sent before the lease ended
                    jobs.run(batches, poller, None, None)
                batches.report()
                log.info("worker %s stopping", spec.worker_id)
                return 0
            if kind == protocol.BATCH:
                batches.from_controller(frames)
            elif kind == protocol.RECALL:  # the controller's batches next: ours first
                if jobs is not None:
                    jobs.run(batches, poller, None, None)
                batches.report()
                sock.send_multipart(protocol.returned(batches.leased_since_ours > 0))
                batches.leased_since_ours = 0
            else:
                log.error("worker dropped a message of kind %r", kind[:8])
        if jobs is not None:
            jobs.run(batches, poller, ready, LEASED_PER_TURN)
        if time.monotonic() - shipped >= METRICS_INTERVAL:
            shipped = time.monotonic()
            ship_metrics(sock, batches.context)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run(WorkerSpec.from_json(argv[0]))


def run(spec: WorkerSpec) -> int:
    """Be the worker ``spec`` describes, in this process (a fresh one or a zygote's fork)."""
    log_to_stderr(spec.log_level, spec.log_format)
    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the daemon, which stops us
    log_format = spec.log_format
    sys.stdout = TaggedStream(sys.stdout, os.getpid(), log_format)
    sys.stderr = TaggedStream(sys.stderr, os.getpid(), log_format, logging.WARNING)
    _set_threads(spec.threads)
    if spec.model_dir and spec.model_dir not in sys.path:
        sys.path.insert(0, spec.model_dir)
    return serve(spec)


if __name__ == "__main__":
    sys.exit(main())
