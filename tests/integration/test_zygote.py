"""Workers are forks of one zygote that imported torch once; the zygote's death loses nothing."""

from __future__ import annotations

import os
import signal

import psutil
from conftest import wait_until


def zygote_of(daemon) -> psutil.Process:
    [zygote] = [p for p in psutil.Process(daemon.proc.pid).children()
                if "mservd.worker.zygote" in " ".join(p.cmdline())]
    return zygote


def maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_every_worker_is_a_fork_of_the_one_zygote(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar,tiny.mar", "default_workers_per_model": 2})
    zygote = zygote_of(daemon)
    pids = daemon.worker_pids("echo") | daemon.worker_pids("tiny")
    assert len(pids) == 4
    assert {psutil.Process(pid).ppid() for pid in pids} == {zygote.pid}
    for pid in pids:  # torch came from the zygote, already mapped before the fork
        assert "libtorch_cpu" in maps(pid)


def test_workers_of_a_model_map_one_copy_of_its_weights(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "resnet18.mar", "default_workers_per_model": 2})
    pids = daemon.worker_pids("resnet18")
    assert len(pids) == 2
    for pid in pids:  # the parameters are the file's pages (mmap), not a private copy
        assert "resnet18.pt" in maps(pid)


def test_torchvision_is_imported_once_in_the_zygote_only_for_models_that_use_it(
        daemon_factory, store) -> None:
    from conftest import write_archive

    write_archive(store, "visionuser", "uses_torchvision.py")
    daemon = daemon_factory({"load_models": "tiny.mar,resnet18.mar"},
                            args=("--enable-model-api",))
    zygote = zygote_of(daemon)
    for pid in daemon.worker_pids("tiny") | daemon.worker_pids("resnet18") | {zygote.pid}:
        assert "torchvision" not in maps(pid)  # the built-in image_classifier needs none
    answer = daemon.manage("POST", "/models", params={"url": "visionuser.mar"})
    assert answer.status_code == 200, answer.text
    [user] = daemon.worker_pids("visionuser")
    assert "torchvision" in maps(zygote.pid)  # imported before the fork, shared with it
    assert "torchvision" in maps(user)
    # the zygote's collector was off while it imported torchvision; its workers' is on
    assert daemon.predict("visionuser", json={}).json() == {"torchvision": True,
                                                            "collecting": True}


def test_workers_collect_garbage_and_share_the_zygotes_frozen_imports(daemon_factory,
                                                                     store) -> None:
    """The zygote imports torch with its collector off and freezes what it imported: a worker
    forked from it collects its own garbage and never scans the shared objects."""
    from conftest import write_archive

    write_archive(store, "collector", "reports_collector.py")
    daemon = daemon_factory({"load_models": "collector.mar"})
    assert daemon.predict("collector", json={}).json() == {"collecting": True, "frozen": True}


def test_a_killed_zygote_takes_its_workers_and_both_come_back(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar", "default_workers_per_model": 2})
    old_zygote = zygote_of(daemon)
    old_workers = daemon.worker_pids("echo")
    os.kill(old_zygote.pid, signal.SIGKILL)
    _gone, alive = psutil.wait_procs([psutil.Process(p) for p in old_workers], timeout=10)
    assert alive == []  # the workers die with their zygote: none is orphaned

    def two_new_ready_workers() -> bool:
        workers = daemon.describe("echo")[0]["workers"]
        return (len(workers) == 2 and all(w["status"] == "READY" for w in workers)
                and not {w["pid"] for w in workers} & old_workers)

    wait_until(two_new_ready_workers, 60, "two new workers")
    assert zygote_of(daemon).pid != old_zygote.pid
    answer = daemon.predict("echo", json={"after": "zygote restart"})
    assert answer.status_code == 200, answer.text
    assert "zygote exited" in (daemon.log_dir / "mservd.log").read_text()
