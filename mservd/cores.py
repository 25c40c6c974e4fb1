"""Intra-op threads that follow the work: a lone busy worker uses every core, several share them.

Giving each of N workers cores/N threads for good wastes the machine whenever fewer are busy
(one request at a time runs on one core of two). So the workers on a host share one count of
those running a batch right now — an integer in anonymous shared memory that the zygote makes
before its first fork, so every worker it forks holds the same one — and before each batch a
CPU worker takes ``cores // busy`` torch threads (at least one).

Only when its batches are worth it: a worker runs its first CALIBRATION batches on one thread,
and shares the cores afterwards only if even the quickest of them took PARALLEL_WORTH or more;
for quicker batches waking helper threads costs more than they save, and idle OpenMP helpers
spin on the cores the frontends and the controller need (measured: tiny, 0.3 ms a batch, served
at half the rate with two threads a worker). The quickest single-threaded batch decides, not a
running average: a slow batch under contention must not tip a model into more threads and so
into more contention. A worker started without the zygote has no count and keeps the threads
its spec gives it.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_busy: Any = None  # the shared count, made by share() in the zygote


def share() -> None:
    """In the zygote, before it forks: make the count its workers will share."""
    global _busy
    if _busy is None:
        _busy = multiprocessing.get_context("fork").Value("i", 0)


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
        """Around one batch: count this worker busy and take its share of the cores."""
        if self.cores is None:
            yield
            return
        if self.calibrated < CALIBRATION:
            yield from self._calibrate()
            return
        if _busy is None or not self.parallel:
            self.set(self.cores if _busy is None and self.parallel else 1)
            yield
            return
        with _busy.get_lock():
            _busy.value += 1
            busy = _busy.value
        try:
            self.set(max(1, self.cores // busy))
            yield
        finally:
            with _busy.get_lock():
                _busy.value -= 1

    def _calibrate(self) -> Iterator[None]:
        self.set(1)
        started = time.perf_counter()
        yield
        self.quickest = min(self.quickest, time.perf_counter() - started)
        self.calibrated += 1
        self.parallel = self.calibrated >= CALIBRATION and self.quickest >= PARALLEL_WORTH
