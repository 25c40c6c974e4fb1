"""Intra-op threads follow the work: a worker alone busy takes every core, busy workers share."""

from __future__ import annotations

import os

import pytest
import torch

from mservd import cores


@pytest.fixture
def shared(monkeypatch):
    """A fresh busy count, as the zygote makes before it forks; torch's threads restored."""
    monkeypatch.setattr(cores, "_busy", None)
    cores.share()
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_lone_busy_worker_takes_every_core_and_two_share_them(shared) -> None:
    first, second = cores.Threads(4), cores.Threads(4)
    for worker in (first, second):  # a model whose batches take 100 ms
        worker.calibrated, worker.parallel = cores.CALIBRATION, True
    with first.batch():
        assert first.now == 4  # alone
        with second.batch():
            assert second.now == 2  # two busy: half each
        assert cores._busy.value == 1
    with second.batch():
        assert second.now == 4  # alone again
    assert cores._busy.value == 0


def test_batches_too_small_to_share_run_on_one_thread(shared) -> None:
    small = cores.Threads(4)
    for _ in range(cores.CALIBRATION):
        with small.batch():
            assert small.now == 1  # calibrating: one thread
    assert not small.parallel  # microseconds of work: not worth waking helper threads
    with small.batch():
        assert small.now == 1 and cores._busy.value == 0  # not even counted busy


def test_batches_worth_it_share_the_cores_after_calibration(shared, monkeypatch) -> None:
    monkeypatch.setattr(cores, "PARALLEL_WORTH", 0.0)
    big = cores.Threads(4)
    for _ in range(cores.CALIBRATION):
        with big.batch():
            pass
    assert big.parallel
    with big.batch():
        assert big.now == 4


def test_forked_workers_count_in_the_same_place(shared) -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker forked after share(): it counts itself busy in the parent's count
        with cores._busy.get_lock():
            cores._busy.value += 1
        os.write(write, b"1")
        os._exit(0)
    os.read(read, 1)
    os.waitpid(pid, 0)
    assert cores._busy.value == 1


def test_a_gpu_worker_leaves_torchs_threads_alone() -> None:
    threads = cores.Threads(None)
    with threads.batch():
        assert threads.now is None
