"""Intra-op threads that follow the work: a lone busy worker uses every core, several share them.

Giving each of N workers cores/N threads for good wastes the machine whenever fewer are busy
(one request at a time runs on one core of two). So the workers on a host share a table of
which of them are at work — anonymous shared memory that the zygote makes before its first
fork, one slot per live worker, each holding until when that worker counts as busy — and
before each batch a CPU worker takes ``cores // busy`` torch threads (at least one).

A worker counts as busy while it runs a batch and for as long again after it (LINGER at
least): its next batch is likely on its way. Counting only the batches running this instant
let a worker that started alone keep every core while a second one started beside it, and
OpenMP threads beyond the cores wait on each other at every barrier (measured: resnet18,
two workers of batch 4 on one thread each, 45 images a second; one of them on two threads
beside the other on one, 27). The zygote clears a slot when its worker exits, however it
exits.

Only when its batches are worth it: a worker runs its first CALIBRATION batches on one thread,
and shares the cores afterwards only if even the quickest of them took PARALLEL_WORTH or more;
for quicker batches waking helper threads costs more than they save, and idle OpenMP helpers
spin on the cores the frontends and the controller need (measured: tiny, 0.3 ms a batch, served
at half the rate with two threads a worker). The quickest single-threaded batch decides, not a
running average: a slow batch under contention must not tip a model into more threads and so
into more contention. A worker started without the zygote has no slot and keeps the threads
its spec gives it.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SLOTS = 256  # workers one zygote can count; one beyond them runs parallel batches on one thread
LINGER = 0.02  # seconds, at least, a worker still counts as busy after its batch
_until: Any = None  # the shared table, made by share() in the zygote: per slot, busy until when
slot: int | None = None  # this worker's slot, set in the worker after its fork


def share() -> None:
    """In the zygote, before it forks: make the table its workers will share."""
    global _until
    if _until is None:
        _until = multiprocessing.get_context("fork").Array("d", SLOTS, lock=False)


def free_slot(taken: set[int]) -> int | None:
    """In the zygote: a slot for the next worker, or None when all are taken."""
    return next((i for i in range(SLOTS) if i not in taken), None)


def release(worker_slot: int) -> None:
    """In the zygote, once the worker in ``worker_slot`` exited: it counts no more."""
    if _until is not None:
        _until[worker_slot] = 0.0


def busy_now(now: float) -> int:
    """How many of the zygote's workers count as busy at ``now``."""
    return sum(1 for until in _until[:] if until > now)


PARALLEL_WORTH = 0.005  # seconds the quickest single-threaded batch must take to share cores
CALIBRATION = 8  # batches run on one thread to measure that


class Threads:
    """One worker's torch threads, re-set only when its share of the cores changes."""

    def __init__(self, cores: int | None) -> None:
        self.cores = cores  # None: on a GPU, or told nothing: torch's own choice stands
        self.now: int | None = None
        self.quickest = float("inf")  # the quickest of the calibration batches, in seconds
        self.calibrated = 0
        self.parallel = False  # its batches are worth more than one thread

    def set(self, threads: int) -> None:
        if threads != self.now:
            import torch

            torch.set_num_threads(threads)
            self.now = threads

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Around one batch: count this worker busy (and a while after) and take its share of
        the cores."""
        if self.cores is None:
            yield
            return
        if self.calibrated < CALIBRATION:
            yield from self._calibrate()
            return
        if not self.parallel:
            self.set(1)
            yield
            return
        if _until is None or slot is None:  # started without the zygote, or past SLOTS
            self.set(self.cores if _until is None else 1)
            yield
            return
        mine, started = slot, time.monotonic()
        _until[mine] = float("inf")  # running
        self.set(max(1, self.cores // busy_now(started)))
        try:
            yield
        finally:
            ended = time.monotonic()
            _until[mine] = ended + max(LINGER, ended - started)

    def _calibrate(self) -> Iterator[None]:
        self.set(1)
        started = time.perf_counter()
        yield
        self.quickest = min(self.quickest, time.perf_counter() - started)
        self.calibrated += 1
        self.parallel = self.calibrated >= CALIBRATION and self.quickest >= PARALLEL_WORTH
