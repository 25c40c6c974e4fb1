"""The frontend processes: gunicorn's arbiter for HTTP, the gRPC frontend; start them, start
again one that dies, stop them.

The daemon binds the listening sockets and hands them here. The HTTP frontends are gunicorn's
business (``frontends/http/arbiter.py``): its arbiter forks, watches and replaces the worker
processes, and each worker writes a byte to a pipe once it serves, which this module counts
(its first ``frontend_workers`` bytes: the HTTP API is up; each after that: a worker started
again). Here the arbiter itself and the gRPC frontend are watched: one that dies while serving
is started again on the same sockets and ports. One that cannot start is not retried for ever:
at start-up the daemon reports why and exits (a broken install or an unusable log file will not
mend itself), and later one started again that exits before it serves MAX_FAILED_STARTS times
in a row is given up; with no HTTP frontend left, the daemon stops. The gRPC frontend says it
serves by writing its ports file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mservd.config import Settings, parse_address, tls
from mservd.process.environment import children_environment
from mservd.specs import GrpcFrontendSpec, HttpFrontendSpec

log = logging.getLogger("mservd")

MAX_FAILED_STARTS = 5  # starts in a row that exit before they serve: the frontend is given up
RESTART_PAUSE = 1.0  # seconds before starting again one that exited before it served
LOG_TAIL = 8  # lines of a frontend's log quoted when it cannot start
GRPC_PORTS_FILE = "grpc.ports.json"


def log_tail(path: Path) -> str:
    """The errors at the end of a frontend's log (its last lines if it logged none): what a
    failed start quotes. Tracebacks and gunicorn's shutdown lines would bury the reason."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    errors = [line for line in lines if " ERROR " in line]
    return "\n".join((errors or lines)[-LOG_TAIL:])


def how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def cors_headers(settings: Settings) -> dict[str, str]:
    """The CORS headers TorchServe's cors_allowed_* keys ask every answer to carry (none
    without an origin)."""
    if not settings.cors_allowed_origin:
        return {}
    headers = {"Access-Control-Allow-Origin": settings.cors_allowed_origin}
    if settings.cors_allowed_methods:
        headers["Access-Control-Allow-Methods"] = settings.cors_allowed_methods
    if settings.cors_allowed_headers:
        headers["Access-Control-Allow-Headers"] = settings.cors_allowed_headers
    return headers


@dataclass
class Frontend:
    """One frontend: its process, whether that said it serves, and how its starts went."""

    name: str
    log_file: Path
    proc: subprocess.Popen | None = None
    served: bool = False  # this process said it serves
    restarts: int = 0  # times started again: before that, an exit before serving fails start-up
    failed_starts: int = 0  # in a row: started and exited before it served
    restart_at: float | None = None  # set while it waits to be started again
    given_up: bool = False

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


class Frontends:
    """The daemon's frontend processes: gunicorn's arbiter (HTTP) and the gRPC frontend."""

    def __init__(self, settings: Settings, log_dir: Path, ports: dict[str, socket.socket],
                 controller: str, auth: bool,
                 restarted: Callable[[str], None] = lambda kind: None) -> None:
        self.restarted = restarted  # told "http" or "grpc" each time one is started again
        reply_timeout = (2 * settings.default_response_timeout
                         + settings.default_startup_timeout + 60)
        addresses = {api: sock.getsockname()[:2] for api, sock in ports.items()}
        self.http_spec = HttpFrontendSpec(
            controller=controller,
            workers=settings.frontend_workers,
            binds=[f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                   for host, port in addresses.values()],
            ports={api: port for api, (_, port) in addresses.items()},
            shed_delay_ms=settings.shed_delay_ms,
            max_queue_wait_ms=settings.max_queue_wait_ms,
            connections=settings.frontend_connections,
            header_timeout=settings.frontend_header_timeout,
            write_timeout=settings.frontend_write_timeout,
            body_timeout=settings.frontend_body_timeout,
            body_bytes=settings.frontend_body_bytes,
            max_header_bytes=settings.limit_request_header_bytes,
            accesslog=str(log_dir / "access_log.log"),
            log_format=settings.log_format,
            log_level=settings.log_level,
            auth=auth,
            max_request_size=settings.max_request_size,
            reply_timeout=reply_timeout,
            unknown_token_limit=settings.unknown_token_limit,
            traffic_key_header=settings.traffic_key_header.lower(),
            gunicorn={  # gunicorn's own settings (config.py documents each key), in
                "graceful_timeout": math.ceil(settings.drain_timeout),  # whole seconds
                "keepalive": math.ceil(settings.frontend_keepalive),
                "timeout": math.ceil(settings.frontend_timeout),
                "limit_request_line": settings.limit_request_line,
                "limit_request_fields": settings.limit_request_fields,
                "limit_request_field_size": settings.limit_request_field_size,
            },
            cors=cors_headers(settings),
            tls_ports=[port for api, (_, port) in addresses.items()
                       if api in tls.tls_apis(settings)],
            certificate_file=settings.certificate_file,
            private_key_file=settings.private_key_file,
        )
        # blacklist_env_vars: what a handler could read in their /proc is no secret
        self.environment = children_environment(settings.blacklist_env_vars)
        self.grpc_ports_file = log_dir / GRPC_PORTS_FILE
        self.grpc_spec = GrpcFrontendSpec(
            controller=controller,
            host=parse_address(settings.inference_address)[1],
            management_host=parse_address(settings.management_address)[1],
            inference_port=settings.grpc_inference_port,
            management_port=settings.grpc_management_port,
            ports_file=str(self.grpc_ports_file),
            auth=auth,
            max_request_size=settings.max_request_size,
            max_response_size=settings.max_response_size,
            reply_timeout=reply_timeout,
            drain_timeout=settings.drain_timeout,
            connections=settings.frontend_connections,
            handshake_timeout=settings.frontend_header_timeout,
            write_timeout=settings.frontend_write_timeout,
            unknown_token_limit=settings.unknown_token_limit,
            traffic_key_header=settings.traffic_key_header.lower(),
            log_level=settings.log_level,
            log_format=settings.log_format,
            certificate_file=settings.certificate_file if settings.enable_grpc_ssl else "",
            private_key_file=settings.private_key_file if settings.enable_grpc_ssl else "",
        )
        self.http = Frontend("HTTP frontend (gunicorn's arbiter)", log_dir / "frontend.log")
        self.grpc = Frontend("gRPC frontend", log_dir / "grpc.log")
        self.grpc_served: dict[str, str] | None = None  # its addresses, once it reported them
        self.ready_pipe: int | None = None  # read end: a byte per HTTP worker that serves
        self.booted = 0  # bytes read from it since the arbiter was started
        self.stopping = False

    # -- starting ------------------------------------------------------------------------

    def start(self) -> None:
        """Start every frontend; ``wait_ready`` tells when the HTTP workers serve."""
        self.grpc_ports_file.unlink(missing_ok=True)
        self.start_http()
        self.start_grpc()
        log.info("HTTP frontends started (gunicorn's arbiter, pid %d) on ports %s; gRPC "
                 "frontend (pid %d)", self.http.proc.pid if self.http.proc else -1,
                 self.http_spec.ports, self.grpc.proc.pid if self.grpc.proc else -1)

    def start_http(self) -> None:
        """Start gunicorn's arbiter with a pipe its workers write to once they serve (the
        pipe ends without a word if they all die first)."""
        self.close_ready_pipe()
        read_end, write_end = os.pipe()
        spec = dataclasses.replace(self.http_spec, ready_fd=write_end)
        try:
            with open(self.http.log_file, "ab") as out:
                self.http.proc = subprocess.Popen(
                    [sys.executable, "-m", "mservd.frontends.http.arbiter", spec.to_json()],
                    pass_fds=[write_end], stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, env=self.environment)
        except OSError:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        os.set_blocking(read_end, False)
        self.ready_pipe, self.booted = read_end, 0
        self.http.served = False

    def start_grpc(self) -> None:
        """Start the gRPC frontend; it binds its own ports, the ones it had before if any."""
        spec = self.grpc_spec
        if self.grpc_served is not None:  # started again: it says it serves by a new file
            self.grpc_ports_file.unlink(missing_ok=True)
            spec = dataclasses.replace(
                spec, inference_port=int(self.grpc_served["inference"].rsplit(":", 1)[1]),
                management_port=int(self.grpc_served["management"].rsplit(":", 1)[1]))
        with open(self.grpc.log_file, "ab") as out:
            self.grpc.proc = subprocess.Popen(
                [sys.executable, "-m", "mservd.frontends.grpc.server", spec.to_json()],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.environment)
        self.grpc.served = False

    def wait_ready(self, timeout: float) -> str | None:
        """Wait until every HTTP worker serves; None then, else why they do not."""
        deadline = time.monotonic() + timeout
        while self.booted < self.http_spec.workers:
            left = deadline - time.monotonic()
            if left <= 0:
                return f"the HTTP frontend's workers did not start within {timeout:.0f} s"
            if self.ready_pipe is None or not self.hear_ready(left):
                return self.cannot_start(self.http)
        return None

    def hear_ready(self, timeout: float) -> bool:
        """Count the HTTP workers that said they serve within ``timeout``; False once none of
        the arbiter's processes is left to say it (the pipe ended)."""
        if self.ready_pipe is None:
            return False
        readable, _, _ = select.select([self.ready_pipe], [], [], timeout)
        if not readable:
            return True
        try:
            heard = os.read(self.ready_pipe, 4096)
        except BlockingIOError:
            return True
        if not heard:
            self.close_ready_pipe()
            return False
        workers = self.http_spec.workers
        for _ in heard:
            self.booted += 1
            if self.booted > workers:  # gunicorn replaced a worker that died
                self.restarted("http")
        self.http.served = True
        return True

    def close_ready_pipe(self) -> None:
        if self.ready_pipe is not None:
            os.close(self.ready_pipe)
            self.ready_pipe = None

    def cannot_start(self, frontend: Frontend) -> str:
        code = None
        if frontend.proc is not None:
            try:
                code = frontend.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        return (f"the {frontend.name} exited as it started (exit code {code}); the end of "
                f"{frontend.log_file}:\n{log_tail(frontend.log_file)}")

    def grpc_addresses(self, timeout: float = 60.0) -> dict[str, str] | None:
        """The gRPC frontend's bound addresses, waiting for it to report them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.grpc_served = json.loads(self.grpc_ports_file.read_text())
                self.grpc.served = True
                return self.grpc_served
            except (OSError, ValueError):
                pass
            if self.grpc.exited() is not None:
                log.error("the gRPC frontend exited; see grpc.log in the log folder")
                return None
            time.sleep(0.05)
        log.error("the gRPC frontend did not report its ports within %.0f s", timeout)
        return None

    # -- watching ------------------------------------------------------------------------

    def watch(self, now: float) -> str | None:
        """Start again the frontends that died; why the daemon must stop, if it must."""
        if self.stopping:
            return None
        self.hear_ready(0.0)
        if not self.grpc.served and self.grpc_served is not None:
            self.grpc.served = self.grpc_ports_file.exists()
        for frontend in (self.http, self.grpc):
            if frontend.given_up:
                continue
            code = frontend.exited()
            if code is None:
                continue
            if frontend.restart_at is None:  # found dead just now
                if not frontend.served and not frontend.restarts:  # never served at all
                    if frontend is self.grpc:
                        frontend.given_up = True  # grpc_addresses says why
                        continue
                    return self.cannot_start(frontend)
                self.schedule_restart(frontend, now, how_it_ended(code))
            if frontend.restart_at is not None and now >= frontend.restart_at:
                frontend.restart_at = None
                frontend.restarts += 1
                try:
                    if frontend is self.grpc:
                        self.start_grpc()
                    else:
                        self.start_http()
                except OSError as exc:
                    log.error("cannot start the %s again: %s", frontend.name, exc)
                    frontend.served = False
                    self.schedule_restart(frontend, now, "could not be started")
                else:
                    assert frontend.proc is not None  # start() made it
                    log.info("%s started again (pid %d)", frontend.name, frontend.proc.pid)
                    self.restarted("grpc" if frontend is self.grpc else "http")
        if self.http.given_up:
            return "no HTTP frontend can run; see frontend.log in the log folder"
        return None

    def schedule_restart(self, frontend: Frontend, now: float, what: str) -> None:
        """Start it again at once if it had served; after a pause if it had not, unless that
        is the MAX_FAILED_STARTS-th time in a row."""
        frontend.failed_starts = 0 if frontend.served else frontend.failed_starts + 1
        if frontend.failed_starts >= MAX_FAILED_STARTS:
            frontend.given_up = True
            log.error("the %s %s before it served, %d starts in a row; it is not started "
                      "again. The end of %s:\n%s", frontend.name, what, frontend.failed_starts,
                      frontend.log_file, log_tail(frontend.log_file))
            return
        frontend.restart_at = now + (RESTART_PAUSE if frontend.failed_starts else 0.0)
        pid = frontend.proc.pid if frontend.proc is not None else -1
        log.error("the %s (pid %d) %s; starting it again", frontend.name, pid, what)

    # -- stopping ------------------------------------------------------------------------

    def alive(self) -> bool:
        return any(f.exited() is None and f.proc is not None for f in (self.http, self.grpc))

    def stop(self) -> None:
        """Ask the frontends to finish what they hold and exit (gunicorn's graceful stop)."""
        self.stopping = True
        self.close_ready_pipe()
        for frontend in (self.http, self.grpc):
            if frontend.proc is not None and frontend.proc.poll() is None:
                frontend.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> None:
        """Wait for the frontends to exit; kill what is left after ``timeout``."""
        for frontend in (self.http, self.grpc):
            if frontend.proc is None:
                continue
            try:
                frontend.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                frontend.proc.kill()
                frontend.proc.wait()
