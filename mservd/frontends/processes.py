"""The frontend processes: start them, start again one that dies, stop them.

The daemon binds the listening sockets and hands them here; the frontends (``frontend_workers``
HTTP ones and one gRPC) each run in their own process. As gunicorn's arbiter does for its
workers, a frontend that dies while serving (a bug, the OOM killer, a stray kill) is started
again, an HTTP one on a fresh listener in the inference port's SO_REUSEPORT group, so the port
keeps answering. One that cannot start is not retried for ever: at start-up the daemon reports
why and exits (a broken install or an unusable log file will not mend itself), and later a
frontend that exits within QUICK_EXIT of its start MAX_QUICK_EXITS times in a row is given up;
with no HTTP frontend left, the daemon stops.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mservd.config import Settings, parse_address

log = logging.getLogger("mservd")

QUICK_EXIT = 5.0  # seconds: a frontend that exits sooner than this after its start failed it
MAX_QUICK_EXITS = 5  # in a row, before a frontend is given up
RESTART_PAUSE = 1.0  # seconds before starting again one that exited at once
LOG_TAIL = 8  # lines of a frontend's log quoted when it cannot start
GRPC_PORTS_FILE = "grpc.ports.json"


def reuseport_listener(family: int, address: tuple[str, int]) -> socket.socket:
    """A listener on ``address`` that joins its SO_REUSEPORT group."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def log_tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-LOG_TAIL:])


def how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class Frontend:
    """One frontend: its process, when that started, and how often it exited at once."""

    name: str
    log_file: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    quick_exits: int = 0
    restart_at: float | None = None  # set while it waits to be started again
    starting: bool = False  # its first start, not yet said to serve: an exit fails the start
    given_up: bool = False

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


class Frontends:
    """The daemon's frontend processes and the listeners they are started with."""

    def __init__(self, settings: Settings, log_dir: Path, listeners: dict[str, socket.socket],
                 controller: str, auth: bool,
                 restarted: Callable[[str], None] = lambda kind: None) -> None:
        self.restarted = restarted  # told "http" or "grpc" each time one is started again
        self.spread = hasattr(socket, "SO_REUSEPORT")  # as the daemon binds it; not on Windows
        inference = listeners["inference"]
        self.inference_address = (inference.family, inference.getsockname()[:2])
        # Each HTTP frontend accepts on its own inference listener, all on one port: the kernel
        # spreads new connections evenly over them, where on one shared listener whichever
        # process woke first took most of them. We keep no copy of those, so a frontend that
        # dies takes its listener out of the group instead of leaving it to gather connections
        # nobody accepts. The management and metrics listeners are shared, and kept here.
        self.shared = {api: sock for api, sock in listeners.items()
                       if api != "inference" or not self.spread}
        self.unused_inference: socket.socket | None = inference if self.spread else None
        self.http_spec: dict[str, Any] = {
            "controller": controller,
            "shed_delay_ms": settings.shed_delay_ms,
            "max_queue_wait_ms": settings.max_queue_wait_ms,
            "connections": settings.frontend_connections,
            "graceful_timeout": settings.drain_timeout,
            "accesslog": str(log_dir / "access_log.log"),
            "log_format": settings.log_format,
            "log_level": settings.log_level,
            "auth": auth,
            "max_request_size": settings.max_request_size,
            "reply_timeout": 2 * settings.default_response_timeout
                             + settings.default_startup_timeout + 60,
        }
        self.grpc_ports_file = log_dir / GRPC_PORTS_FILE
        self.grpc_spec: dict[str, Any] = {
            "controller": controller,
            "host": parse_address(settings.inference_address)[1],
            "management_host": parse_address(settings.management_address)[1],
            "inference_port": settings.grpc_inference_port,
            "management_port": settings.grpc_management_port,
            "ports_file": str(self.grpc_ports_file),
            "auth": auth,
            "max_request_size": settings.max_request_size,
            "max_response_size": settings.max_response_size,
            "reply_timeout": self.http_spec["reply_timeout"],
            "graceful_timeout": settings.drain_timeout,
            "log_level": settings.log_level,
            "log_format": settings.log_format,
        }
        self.http = [Frontend(f"HTTP frontend {i + 1}", log_dir / "frontend.log")
                     for i in range(settings.frontend_workers)]
        self.grpc = Frontend("gRPC frontend", log_dir / "grpc.log")
        self.grpc_served: dict[str, str] | None = None  # its addresses, once it reported them
        self.not_ready: dict[int, Frontend] = {}  # read end of a ready pipe -> its frontend
        self.stopping = False

    # -- starting ------------------------------------------------------------------------

    def start(self) -> None:
        """Start every frontend; ``wait_ready`` tells when the HTTP ones serve."""
        self.grpc_ports_file.unlink(missing_ok=True)
        for frontend in self.http:
            read_end = self.start_http(frontend, tell_ready=True)
            self.not_ready[read_end] = frontend
            frontend.starting = True
        self.start_grpc()
        ports = {api: sock.getsockname()[1] for api, sock in self.shared.items()}
        ports["inference"] = self.inference_address[1][1]
        log.info("HTTP frontends started (pids %s) on ports %s; gRPC frontend (pid %d)",
                 ", ".join(str(f.proc.pid) for f in self.http if f.proc is not None), ports,
                 self.grpc.proc.pid if self.grpc.proc is not None else -1)

    def start_http(self, frontend: Frontend, tell_ready: bool = False) -> int:
        """Start an HTTP frontend on its own inference listener; with ``tell_ready``, return
        the read end of a pipe it writes to once it serves (and that ends if it dies first)."""
        if not self.spread:
            own = self.shared["inference"]
        elif self.unused_inference is not None:  # the one the daemon bound, for the first
            own, self.unused_inference = self.unused_inference, None
        else:
            own = reuseport_listener(*self.inference_address)
        socks = {**self.shared, "inference": own}
        listeners = {api: {"fd": sock.fileno(), "port": sock.getsockname()[1]}
                     for api, sock in socks.items()}
        spec = {**self.http_spec, "listeners": listeners}
        fds = [listener["fd"] for listener in listeners.values()]
        read_end = write_end = -1
        if tell_ready:
            read_end, write_end = os.pipe()
            spec["ready_fd"] = write_end
            fds.append(write_end)
        try:
            with open(frontend.log_file, "ab") as out:
                frontend.proc = subprocess.Popen(
                    [sys.executable, "-m", "mservd.frontends.http.server", json.dumps(spec)],
                    pass_fds=fds, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT)
        finally:
            if own is not self.shared.get("inference"):
                own.close()
            if write_end >= 0:
                os.close(write_end)
        frontend.started = time.monotonic()
        return read_end

    def start_grpc(self) -> None:
        """Start the gRPC frontend; it binds its own ports, the ones it had before if any."""
        spec = dict(self.grpc_spec)
        if self.grpc_served is not None:
            spec["inference_port"] = int(self.grpc_served["inference"].rsplit(":", 1)[1])
            spec["management_port"] = int(self.grpc_served["management"].rsplit(":", 1)[1])
        with open(self.grpc.log_file, "ab") as out:
            self.grpc.proc = subprocess.Popen(
                [sys.executable, "-m", "mservd.frontends.grpc.server", json.dumps(spec)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self.grpc.started = time.monotonic()

    def wait_ready(self, timeout: float) -> str | None:
        """Wait until every HTTP frontend serves; None then, else why one does not."""
        deadline = time.monotonic() + timeout
        while self.not_ready:
            left = deadline - time.monotonic()
            if left <= 0:
                names = ", ".join(f.name for f in self.not_ready.values())
                return f"{names} did not start within {timeout:.0f} s"
            failed = self.hear_ready(left)
            if failed is not None:
                return self.cannot_start(failed)
        return None

    def hear_ready(self, timeout: float) -> Frontend | None:
        """Read what the starting frontends said within ``timeout``; one whose pipe ended
        without a word exited before it served, and is returned."""
        readable, _, _ = select.select(list(self.not_ready), [], [], timeout)
        for fd in readable:
            frontend = self.not_ready.pop(fd)
            said = os.read(fd, 1)
            os.close(fd)
            if not said:
                return frontend
            frontend.starting = False
        return None

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
        if self.not_ready:
            failed = self.hear_ready(0.0)
            if failed is not None:
                return self.cannot_start(failed)
        for frontend in [*self.http, self.grpc]:
            if frontend.given_up:
                continue
            code = frontend.exited()
            if code is None:
                continue
            if frontend.starting:  # died before it ever served
                return self.cannot_start(frontend)
            if frontend is self.grpc and self.grpc_served is None:
                frontend.given_up = True  # never served: grpc_addresses says why
                continue
            if frontend.restart_at is None:
                self.schedule_restart(frontend, now, how_it_ended(code))
            elif now >= frontend.restart_at:
                frontend.restart_at = None
                try:
                    if frontend is self.grpc:
                        self.start_grpc()
                    else:
                        self.start_http(frontend)
                except OSError as exc:
                    log.error("cannot start the %s again: %s", frontend.name, exc)
                    frontend.started = now
                    self.schedule_restart(frontend, now, "could not start")
                else:
                    log.info("%s started again (pid %d)", frontend.name, frontend.proc.pid)
                    self.restarted("grpc" if frontend is self.grpc else "http")
        if all(f.given_up for f in self.http):
            return "no HTTP frontend can run; see frontend.log in the log folder"
        return None

    def schedule_restart(self, frontend: Frontend, now: float, what: str) -> None:
        quick = now - frontend.started < QUICK_EXIT
        frontend.quick_exits = frontend.quick_exits + 1 if quick else 0
        if frontend.quick_exits >= MAX_QUICK_EXITS:
            frontend.given_up = True
            log.error("the %s %s %d times in a row within %.0f s of its start; it is not "
                      "started again. The end of %s:\n%s", frontend.name, what,
                      frontend.quick_exits, QUICK_EXIT, frontend.log_file,
                      log_tail(frontend.log_file))
            return
        frontend.restart_at = now + (RESTART_PAUSE if quick else 0.0)
        pid = frontend.proc.pid if frontend.proc is not None else -1
        log.error("the %s (pid %d) %s; starting it again", frontend.name, pid, what)

    # -- stopping ------------------------------------------------------------------------

    def alive(self) -> bool:
        return any(f.exited() is None and f.proc is not None for f in [*self.http, self.grpc])

    def stop(self) -> None:
        """Close our copies of the listeners, and ask the frontends to finish and exit."""
        self.stopping = True
        for sock in self.shared.values():
            sock.close()
        if self.unused_inference is not None:
            self.unused_inference.close()
        for fd in self.not_ready:
            os.close(fd)
        self.not_ready.clear()
        for frontend in [*self.http, self.grpc]:
            if frontend.proc is not None and frontend.proc.poll() is None:
                frontend.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> None:
        """Wait for the frontends to exit; kill what is left after ``timeout``."""
        for frontend in [*self.http, self.grpc]:
            if frontend.proc is None:
                continue
            try:
                frontend.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                frontend.proc.kill()
                frontend.proc.wait()
