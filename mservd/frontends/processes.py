"""The frontend processes: start them, start again one that dies, stop them.

The daemon binds the listening sockets and hands them here; the frontends (``frontend_workers``
HTTP ones and one gRPC) each run in their own process. As gunicorn's arbiter does for its
workers, a frontend that dies while serving (a bug, the OOM killer, a stray kill) is started
again, an HTTP one on a fresh listener in the inference port's SO_REUSEPORT group, so the port
keeps answering. One that cannot start is not retried for ever: at start-up the daemon reports
why and exits (a broken install or an unusable log file will not mend itself), and later a
frontend started again that exits before it serves MAX_FAILED_STARTS times in a row is given
up; with no HTTP frontend left, the daemon stops. A frontend says it serves: an HTTP one writes
a byte to a pipe it is given, the gRPC one writes its ports file.
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

MAX_FAILED_STARTS = 5  # starts in a row that exit before they serve: the frontend is given up
RESTART_PAUSE = 1.0  # seconds before starting again one that exited before it served
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
            self.start_http(frontend)
        self.start_grpc()
        ports = {api: sock.getsockname()[1] for api, sock in self.shared.items()}
        ports["inference"] = self.inference_address[1][1]
        log.info("HTTP frontends started (pids %s) on ports %s; gRPC frontend (pid %d)",
                 ", ".join(str(f.proc.pid) for f in self.http if f.proc is not None), ports,
                 self.grpc.proc.pid if self.grpc.proc is not None else -1)

    def start_http(self, frontend: Frontend) -> None:
        """Start an HTTP frontend on its own inference listener, with a pipe it writes to once
        it serves (the pipe ends without a word if it dies first)."""
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
        read_end, write_end = os.pipe()
        spec["ready_fd"] = write_end
        fds = [*(listener["fd"] for listener in listeners.values()), write_end]
        try:
            with open(frontend.log_file, "ab") as out:
                frontend.proc = subprocess.Popen(
                    [sys.executable, "-m", "mservd.frontends.http.server", json.dumps(spec)],
                    pass_fds=fds, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT)
        except OSError:
            os.close(read_end)
            raise
        finally:
            if own is not self.shared.get("inference"):
                own.close()
            os.close(write_end)
        frontend.served = False
        self.not_ready[read_end] = frontend

    def start_grpc(self) -> None:
        """Start the gRPC frontend; it binds its own ports, the ones it had before if any."""
        spec = dict(self.grpc_spec)
        if self.grpc_served is not None:  # started again: it says it serves by a new file
            self.grpc_ports_file.unlink(missing_ok=True)
            spec["inference_port"] = int(self.grpc_served["inference"].rsplit(":", 1)[1])
            spec["management_port"] = int(self.grpc_served["management"].rsplit(":", 1)[1])
        with open(self.grpc.log_file, "ab") as out:
            self.grpc.proc = subprocess.Popen(
                [sys.executable, "-m", "mservd.frontends.grpc.server", json.dumps(spec)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self.grpc.served = False

    def wait_ready(self, timeout: float) -> str | None:
        """Wait until every HTTP frontend serves; None then, else why one does not."""
        deadline = time.monotonic() + timeout
        while self.not_ready:
            left = deadline - time.monotonic()
            if left <= 0:
                names = ", ".join(f.name for f in self.not_ready.values())
                return f"{names} did not start within {timeout:.0f} s"
            for frontend in self.hear_ready(left):
                if not frontend.served:  # the pipe ended without a word
                    return self.cannot_start(frontend)
        return None

    def hear_ready(self, timeout: float) -> list[Frontend]:
        """Read what the starting HTTP frontends said within ``timeout``: those heard from
        either serve now or exited before they did."""
        readable, _, _ = select.select(list(self.not_ready), [], [], timeout)
        heard = []
        for fd in readable:
            frontend = self.not_ready.pop(fd)
            frontend.served = os.read(fd, 1) == b"1"
            os.close(fd)
            heard.append(frontend)
        return heard

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
        if self.not_ready:
            self.hear_ready(0.0)
        if not self.grpc.served and self.grpc_served is not None:
            self.grpc.served = self.grpc_ports_file.exists()
        for frontend in [*self.http, self.grpc]:
            if frontend.given_up:
                continue
            code = frontend.exited()
            if code is None:
                continue
            if frontend.restart_at is None:  # found dead just now
                if frontend in self.not_ready.values():  # reaped: all it wrote is there
                    self.hear_ready(0.0)
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
                        self.start_http(frontend)
                except OSError as exc:
                    log.error("cannot start the %s again: %s", frontend.name, exc)
                    frontend.served = False
                    self.schedule_restart(frontend, now, "could not be started")
                else:
                    log.info("%s started again (pid %d)", frontend.name, frontend.proc.pid)
                    self.restarted("grpc" if frontend is self.grpc else "http")
        if all(f.given_up for f in self.http):
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
