"""Intra-op threads follow the work: a worker alone busy takes every core, busy workers share."""

from __future__ import annotations

import os
import socket
import time
import types

import pytest
import torch

from mservd.worker import cores, zygote


@pytest.fixture
def shared(monkeypatch):
    """A fresh busy table, as the zygote makes before it forks; torch's threads restored."""
    monkeypatch.setattr(cores, "_until", None)
    monkeypatch.setattr(cores, "slot", None)
    cores.share()
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Clock:
    """The monotonic clock cores.py reads, moved by hand: lingering is judged without sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(cores, "time", types.SimpleNamespace(monotonic=fake,
                                                             perf_counter=time.perf_counter))
    return fake


@pytest.fixture
def in_slot(monkeypatch):
    """Run a Threads' batch as the worker in a given slot (each worker process has its own)."""
    def enter(threads: cores.Threads, worker_slot: int):
        monkeypatch.setattr(cores, "slot", worker_slot)
        return threads.batch()
    return enter


def test_a_lone_busy_worker_takes_every_core_and_two_share_them(shared, clock,
                                                                in_slot) -> None:
    first, second = cores.Threads(4), cores.Threads(4)
    for threads in (first, second):  # a model whose batches take 100 ms
        threads.calibrated, threads.parallel = cores.CALIBRATION, True
    with in_slot(first, 0):
        assert first.now == 4  # alone
        with in_slot(second, 1):
            assert second.now == 2  # two busy: half each
    assert cores.busy_now(clock.now) == 2  # each lingers a moment after its batch
    clock.now += cores.LINGER * 1.5
    assert cores.busy_now(clock.now) == 0
    with in_slot(second, 1):
        assert second.now == 4  # alone again


def test_a_worker_just_done_still_counts_so_a_neighbour_starts_on_its_share(
        shared, clock, in_slot) -> None:
    first, second = cores.Threads(4), cores.Threads(4)
    for threads in (first, second):
        threads.calibrated, threads.parallel = cores.CALIBRATION, True
    with in_slot(first, 0):
        pass
    with in_slot(second, 1):  # the first's next batch is on its way: not every core
        assert second.now == 2
    with in_slot(first, 0):  # and it starts its next on its share, not oversubscribing
        assert first.now == 2


def test_a_worker_counts_as_long_after_a_batch_as_the_batch_took(shared, clock,
                                                                  in_slot) -> None:
    slow = cores.Threads(4)
    slow.calibrated, slow.parallel = cores.CALIBRATION, True
    with in_slot(slow, 0):
        clock.now += cores.LINGER * 3
    clock.now += cores.LINGER * 1.5  # past LINGER, not past its batch time
    assert cores.busy_now(clock.now) == 1
    clock.now += cores.LINGER * 1.5
    assert cores.busy_now(clock.now) == 0


def test_a_released_slot_counts_no_more_and_is_taken_again_first(shared, in_slot,
                                                                  clock) -> None:
    threads = cores.Threads(4)
    threads.calibrated, threads.parallel = cores.CALIBRATION, True
    with pytest.raises(RuntimeError), in_slot(threads, 3):
        raise RuntimeError("killed mid-batch")
    assert cores.busy_now(clock.now) == 1  # its batch lingers a moment
    cores.release(3)
    assert cores.busy_now(clock.now) == 0
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


def test_the_zygote_clears_the_slot_of_a_worker_killed_mid_batch(shared) -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker marks itself running, then dies without a word
        cores._until[2] = float("inf")
        os.write(write, b"1")
        os.kill(os.getpid(), 9)
    os.read(read, 1)
    ours, theirs = socket.socketpair()
    try:
        children, by_id, slots = {pid: "w"}, {"w": pid}, {pid: 2}
        while children:  # what the zygote does when SIGCHLD wakes it
            zygote._reap(ours, children, by_id, slots)
        assert cores.busy_now(time.monotonic()) == 0 and slots == {}
        assert b'"exited": "w"' in theirs.recv(4096)
    finally:
        ours.close()
        theirs.close()


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
