"""Intra-op threads follow the work: a worker alone busy takes every core, busy workers share."""

from __future__ import annotations

import os
import time

import pytest
import torch

from mservd import cores


@pytest.fixture
def shared(monkeypatch):
    """A fresh busy table, as the zygote makes before it forks; torch's threads restored."""
    monkeypatch.setattr(cores, "_until", None)
    monkeypatch.setattr(cores, "slot", None)
    cores.share()
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def in_slot(monkeypatch):
    """Run a Threads' batch as the worker in a given slot (each worker process has its own)."""
    def enter(threads: cores.Threads, worker_slot: int):
        monkeypatch.setattr(cores, "slot", worker_slot)
        return threads.batch()
    return enter


def test_a_lone_busy_worker_takes_every_core_and_two_share_them(shared, in_slot) -> None:
    first, second = cores.Threads(4), cores.Threads(4)
    for threads in (first, second):  # a model whose batches take 100 ms
        threads.calibrated, threads.parallel = cores.CALIBRATION, True
    with in_slot(first, 0):
        assert first.now == 4  # alone
        with in_slot(second, 1):
            assert second.now == 2  # two busy: half each
    assert cores.busy_now(time.monotonic()) == 2  # each lingers a moment after its batch
    time.sleep(cores.LINGER * 1.5)
    assert cores.busy_now(time.monotonic()) == 0
    with in_slot(second, 1):
        assert second.now == 4  # alone again


def test_a_worker_just_done_still_counts_so_a_neighbour_starts_on_its_share(
        shared, in_slot) -> None:
    first, second = cores.Threads(4), cores.Threads(4)
    for threads in (first, second):
        threads.calibrated, threads.parallel = cores.CALIBRATION, True
    with in_slot(first, 0):
        pass
    with in_slot(second, 1):  # the first's next batch is on its way: not every core
        assert second.now == 2
    with in_slot(first, 0):  # and it starts its next on its share, not oversubscribing
        assert first.now == 2


def test_a_worker_counts_as_long_after_a_batch_as_the_batch_took(shared, in_slot) -> None:
    slow = cores.Threads(4)
    slow.calibrated, slow.parallel = cores.CALIBRATION, True
    with in_slot(slow, 0):
        time.sleep(cores.LINGER * 3)
    time.sleep(cores.LINGER * 1.5)  # past LINGER, not past its batch time
    assert cores.busy_now(time.monotonic()) == 1


def test_the_zygote_releases_the_slot_of_a_worker_that_exited(shared, in_slot) -> None:
    threads = cores.Threads(4)
    threads.calibrated, threads.parallel = cores.CALIBRATION, True
    with pytest.raises(RuntimeError), in_slot(threads, 3):
        raise RuntimeError("killed mid-batch")
    assert cores.busy_now(time.monotonic()) == 1
    cores.release(3)
    assert cores.busy_now(time.monotonic()) == 0
    assert cores.free_slot({0, 1, 2}) == 3


def test_batches_too_small_to_share_run_on_one_thread(shared, in_slot) -> None:
    small = cores.Threads(4)
    for _ in range(cores.CALIBRATION):
        with in_slot(small, 0):
            assert small.now == 1  # calibrating: one thread
    assert not small.parallel  # microseconds of work: not worth waking helper threads
    with in_slot(small, 0):
        assert small.now == 1 and cores.busy_now(time.monotonic()) == 0  # not counted busy


def test_batches_worth_it_share_the_cores_after_calibration(shared, in_slot,
                                                             monkeypatch) -> None:
    monkeypatch.setattr(cores, "PARALLEL_WORTH", 0.0)
    big = cores.Threads(4)
    for _ in range(cores.CALIBRATION):
        with in_slot(big, 0):
            pass
    assert big.parallel
    with in_slot(big, 0):
        assert big.now == 4


def test_a_worker_without_a_slot_runs_parallel_batches_on_one_thread(shared) -> None:
    threads = cores.Threads(4)
    threads.calibrated, threads.parallel = cores.CALIBRATION, True
    with threads.batch():  # past SLOTS: it cannot count itself, so it takes no other's core
        assert threads.now == 1


def test_forked_workers_count_in_the_same_table(shared) -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker forked after share(): it marks itself busy in the parent's table
        cores._until[5] = float("inf")
        os.write(write, b"1")
        os._exit(0)
    os.read(read, 1)
    os.waitpid(pid, 0)
    assert cores.busy_now(time.monotonic()) == 1


def test_a_gpu_worker_leaves_torchs_threads_alone() -> None:
    threads = cores.Threads(None)
    with threads.batch():
        assert threads.now is None
