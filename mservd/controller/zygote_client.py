"""The supervisor's end of the worker zygote (``mservd/worker/zygote.py``): start it, ask it
to fork a worker, signal one, and learn their pids and exits from its reports.

The zygote forks every worker, so the controller never does: it keeps a :class:`Child` for each,
which reads like ``subprocess.Popen`` to the supervisor (poll, signals) and works through the
zygote's socket. The messages are in the zygote's docstring.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import select
import signal
import socket
import subprocess
import sys
import time

from mservd.process.environment import children_environment
from mservd.specs import ZYGOTE_MESSAGE_MAX, WorkerSpec, send_zygote_message

log = logging.getLogger("mservd.zygote")


class Child:
    """A worker process as the supervisor sees it: Popen's poll and signals, via the zygote."""

    def __init__(self, zygote: Zygote, worker_id: str) -> None:
        self.zygote = zygote
        self.worker_id = worker_id
        self.pid: int | None = None  # known once the zygote has forked it
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.read_reports()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.zygote.signal(self.worker_id, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The supervisor's end: start the zygote, ask it for workers, learn their pids and exits."""

    def __init__(self, hidden_env: str = "") -> None:
        self.hidden_env = hidden_env  # blacklist_env_vars: a pattern of names
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.children: dict[str, Child] = {}

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, ZYGOTE_MESSAGE_MAX)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mservd.worker.zygote", str(theirs.fileno())],
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            env=children_environment(self.hidden_env),
        )
        theirs.close()
        ours.setblocking(False)
        self.sock = ours
        log.info("worker zygote started (pid %d)", self.proc.pid)

    def spawn(self, spec: WorkerSpec, log_fd: int) -> Child:
        worker_id = spec.worker_id
        if self.sock is None:
            self.start()
        assert self.sock is not None
        child = Child(self, worker_id)
        self.children[worker_id] = child
        self.sock.setblocking(True)
        try:
            send_zygote_message(self.sock, {"spawn": dataclasses.asdict(spec)}, [log_fd])
        except OSError as exc:  # the zygote is gone: the worker never starts
            log.error("could not ask the zygote for worker %s: %s", worker_id, exc)
            self._lost()
        finally:
            if self.sock is not None:
                self.sock.setblocking(False)
        return child

    def signal(self, worker_id: str, sig: int) -> None:
        if self.sock is None:
            return
        try:
            self.sock.setblocking(True)
            send_zygote_message(self.sock, {"signal": worker_id, "sig": int(sig)})
        except OSError:
            self._lost()
        finally:
            if self.sock is not None:
                self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def read_reports(self) -> None:
        """Take every report waiting on the socket, without blocking."""
        while self.sock is not None:
            try:
                data = self.sock.recv(ZYGOTE_MESSAGE_MAX)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            report = json.loads(data)
            if "spawned" in report:
                child = self.children.get(report["spawned"])
                if child is not None:
                    child.pid = report["pid"]
            elif "exited" in report:
                child = self.children.pop(report["exited"], None)
                if child is not None:
                    child.returncode = report["code"]

    def _lost(self) -> None:
        """The zygote died (its workers die with it): every child reads as killed."""
        code = self.proc.poll() if self.proc is not None else None
        if self.proc is not None and code is None:
            self.proc.kill()
            code = self.proc.wait()
        log.error("the worker zygote exited (%s); its workers are gone", code)
        for child in self.children.values():
            child.returncode = -signal.SIGKILL
        self.children.clear()
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self.proc = None

    def stop(self, grace: float) -> None:
        """TERM every worker, KILL those still there after ``grace`` seconds, end the zygote."""
        for child in list(self.children.values()):
            child.terminate()
        deadline = time.monotonic() + grace
        while self.children and time.monotonic() < deadline:
            select.select([self.fileno()], [], [], 0.05)
            self.read_reports()
        for child in list(self.children.values()):
            child.kill()
        if self.sock is not None:
            self.sock.close()  # the zygote reads end-of-file, kills what is left and exits
            self.sock = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        self.children.clear()
