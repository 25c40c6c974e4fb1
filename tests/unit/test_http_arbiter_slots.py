"""The HTTP frontends' listeners are held by gunicorn's arbiter, a set per worker slot, so a
worker that dies leaves its listeners and their queued connections to its replacement
(``frontends/http/arbiter.py``; the integration test kills a worker with connections queued)."""

from __future__ import annotations

import inspect
import socket
from types import SimpleNamespace

from gunicorn.arbiter import Arbiter
from http_spec import http_frontend_spec

from mservd.controller.daemon import hold_port
from mservd.frontends.http.arbiter import FrontendArbiter, FrontendServer, slot_listeners


def test_gunicorn_takes_the_listeners_and_the_hooks_the_arbiter_sets() -> None:
    assert "if not self.LISTENERS:" in inspect.getsource(Arbiter.start)
    spawn = inspect.getsource(Arbiter.spawn_worker)
    for line in ("self.cfg.pre_fork(self, worker)", "self.cfg.post_fork(self, worker)",
                 "if self.cfg.reuse_port and"):  # its own listeners per worker: off here
        assert line in spawn, line
    assert spawn.index("pre_fork") < spawn.index("os.fork()") < spawn.index("post_fork")
    assert FrontendServer(http_frontend_spec()).cfg.reuse_port is False


def test_a_replacement_worker_takes_the_listeners_of_the_worker_it_replaces() -> None:
    held = hold_port("http://127.0.0.1:0", "the inference address")  # as the daemon does
    port = held.getsockname()[1]
    server = FrontendServer(http_frontend_spec(workers=2, binds=[f"127.0.0.1:{port}"]))
    arbiter = FrontendArbiter.__new__(FrontendArbiter)  # its fields, without gunicorn's start
    arbiter.cfg, arbiter.log, arbiter.WORKERS = server.cfg, None, {}
    arbiter.slots = [slot_listeners(server.cfg, None) for _ in range(2)]
    arbiter.LISTENERS = [lnr for slot in arbiter.slots for lnr in slot]
    try:
        for lnr in arbiter.LISTENERS:  # each listening on the port the daemon holds
            assert lnr.sock.getsockname()[1] == port
            assert lnr.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        workers = [SimpleNamespace(sockets=arbiter.LISTENERS) for _ in range(3)]
        for pid, worker in enumerate(workers[:2]):
            arbiter.give_slot(worker)
            arbiter.WORKERS[pid] = worker
        assert {workers[0].slot, workers[1].slot} == {0, 1}
        dead = arbiter.WORKERS.pop(0)  # reaped
        arbiter.give_slot(workers[2])
        assert workers[2].slot == dead.slot
        assert workers[2].sockets is arbiter.slots[dead.slot]  # the same sockets, still open
        assert len(arbiter.slots) == 2
    finally:
        for lnr in arbiter.LISTENERS:
            lnr.close()
        held.close()
