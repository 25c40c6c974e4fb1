"""The worker zygote: one process that imports torch once and forks every worker from itself.

Importing torch costs seconds of CPU and a few hundred MiB of private memory per interpreter.
The zygote pays that once, freezes its objects (``gc.freeze``, so no collection ever writes to
those pages) and forks a worker per request: each worker shares the zygote's pages copy-on-write
and is serving as soon as its model has loaded. The zygote never creates a thread, a ZeroMQ
context or a CUDA context, so every fork is clean; a worker makes its own after the fork.

The supervisor owns one :class:`Zygote` (started with the controller, so torch imports while the
frontends start) and talks to it over a Unix SEQPACKET socket pair, one JSON message per packet:

    supervisor -> zygote   {"spawn": SPEC}        the worker's log file descriptor attached
                           {"signal": ID, "sig": N}
    zygote -> supervisor   {"spawned": ID, "pid": PID}
                           {"exited": ID, "code": CODE}   CODE as Popen.returncode reads it

A worker's parent is the zygote, so the supervisor cannot ``wait`` for it; the zygote reaps its
children and reports their exits. The zygote dies with the controller and its workers die with
the zygote (parent-death signals), so nothing outlives the daemon.

Run as ``python -m mservd.worker.zygote FD``; the supervisor starts it.
"""

from __future__ import annotations

import ast
import ctypes
import errno
import gc
import importlib
import json
import logging
import os
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from mservd.specs import ZYGOTE_MESSAGE_MAX, WorkerSpec, send_zygote_message
from mservd.worker import cores

log = logging.getLogger("mservd.worker.zygote")

# Imported before the first fork, so every worker shares them.
PRELOAD = (
    "torch",
    "numpy",
    "PIL.Image",
    "mservd.worker.main",
    "handlers.loader",
    "handlers.base_handler",
    "handlers.ts_compat",
)
# Heavy libraries imported only when a model's code imports them (torchvision alone pulls in
# torch._dynamo, about 3 s and 90 MiB): the zygote imports one before forking that model's
# workers, so they share it, and a model that never uses it does not wait for it.
SHARED_LIBRARIES = ("torchvision", "torchaudio", "transformers", "timm")
_PR_SET_NAME = 15


def preload() -> None:
    gc.disable()  # see _freeze_imports
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            log.warning("zygote could not preload %s: %s", name, exc)
    _freeze_imports()


def _freeze_imports() -> None:
    """What the zygote imported, frozen (``gc.freeze``): no collection in a worker ever writes
    to those shared pages. The collector is off while it imports, as Python's documentation of
    ``gc.freeze`` advises for a process that forks: importing torch allocates millions of
    objects, and the collections they set off and a full one before the freeze (~0.1 s each
    way) were on the path to ready. The little cyclic garbage an import leaves (~7,000 objects
    for torch) is frozen with the rest, shared by every worker."""
    gc.freeze()
    gc.enable()


def libraries_for(spec: WorkerSpec) -> list[str]:
    """The :data:`SHARED_LIBRARIES` the model's handler and code files import (the built-in
    handlers import none of them)."""
    if spec.install_py_dep_per_model:
        return []  # its own requirements may pin another version: the worker imports its own
    found: set[str] = set()
    for path in Path(spec.model_dir or ".").glob("*.py"):
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found.update(top for top in (n.partition(".")[0] for n in names)
                         if top in SHARED_LIBRARIES)
    return sorted(found)


def import_shared(names: list[str]) -> None:
    fresh = [name for name in names if name not in sys.modules]
    if fresh:
        gc.disable()  # see _freeze_imports
    for name in fresh:
        started = time.monotonic()
        try:
            importlib.import_module(name)
        except Exception as exc:  # the worker will meet the same error and report it
            log.warning("zygote could not import %s: %s", name, exc)
            continue
        log.info("zygote imported %s for its workers in %.2f s", name, time.monotonic() - started)
    if fresh:
        _freeze_imports()


def fork_worker(spec: WorkerSpec, log_fd: int, sock: socket.socket, pipe: tuple[int, int],
                worker_slot: int | None = None) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sock.close()
        for fd in pipe:
            os.close(fd)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        _reseed()
        cores.slot = worker_slot  # where it counts itself busy (mservd/worker/cores.py)
        _name_process(f"mservd:{spec.model_name}")
        from mservd.worker.main import run

        code = run(spec)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    return 0  # not reached


def _name_process(name: str) -> None:
    """What ``ps -o comm`` and ``top`` show for this worker (its command line is the zygote's)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except OSError:
        pass  # not glibc Linux: the worker keeps the zygote's name


def _reseed() -> None:
    """Forks share the zygote's random state; give each worker its own."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def serve(sock: socket.socket) -> int:
    from mservd.process.lifeline import die_with_parent

    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the daemon, which stops us
    preload()
    cores.share()  # before the first fork: every worker counts itself busy in the same table
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    children: dict[int, str] = {}
    by_id: dict[str, int] = {}
    slots: dict[int, int] = {}  # pid -> its slot in the busy table
    while True:
        watched: list[Any] = [sock, wake_r]
        readable, _, _ = select.select(watched, [], [])
        if wake_r in readable:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        _reap(sock, children, by_id, slots)
        if sock not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, ZYGOTE_MESSAGE_MAX, 4)
        except OSError as exc:
            if exc.errno != errno.EINTR:
                data, fds = b"", []
            else:
                continue
        if not data:
            return _finish(children)
        request = json.loads(data)
        if "spawn" in request:
            spec = WorkerSpec.from_json(request["spawn"])
            import_shared(libraries_for(spec))
            worker_slot = cores.free_slot(set(slots.values()))
            pid = fork_worker(spec, fds[0], sock, (wake_r, wake_w), worker_slot)
            if worker_slot is not None:
                slots[pid] = worker_slot
            os.close(fds[0])
            children[pid] = spec.worker_id
            by_id[spec.worker_id] = pid
            send_zygote_message(sock, {"spawned": spec.worker_id, "pid": pid})
        elif "signal" in request:
            target = by_id.get(request["signal"])
            if target is not None:
                try:
                    os.kill(target, request["sig"])
                except ProcessLookupError:
                    pass
        for fd in fds[1:]:
            os.close(fd)


def _reap(sock: socket.socket, children: dict[int, str], by_id: dict[str, int],
          slots: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        worker_slot = slots.pop(pid, None)
        if worker_slot is not None:  # however it ended, it counts busy no more
            cores.release(worker_slot)
        worker_id = children.pop(pid, None)
        if worker_id is None:
            continue
        by_id.pop(worker_id, None)
        send_zygote_message(sock, {"exited": worker_id, "code": os.waitstatus_to_exitcode(status)})


def _finish(children: dict[int, str]) -> int:
    """The supervisor went away: no worker may outlive it."""
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s [pid {os.getpid()}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    sock = socket.socket(fileno=int(argv[0]))
    sock.setblocking(True)
    return serve(sock)


if __name__ == "__main__":
    sys.exit(main())
