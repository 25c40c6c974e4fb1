"""Intra-op threads that follow the work: a lone busy worker uses every core, several share them.

Giving each of N workers cores/N threads for good wastes the machine whenever fewer are busy
(one request at a time runs on one core of two). So the workers on a host share one count of
those running a batch right now — an integer in anonymous shared memory that the zygote makes
before its first fork, so every worker it forks holds the same one — and before each batch a
CPU worker takes ``cores // busy`` torch threads (at least one).

Only when its batches are worth it: a batch that takes less than PARALLEL_WORTH of CPU runs on
one thread, since waking helper threads for it costs more than they save, and idle OpenMP
helpers spin on the cores the frontends and the controller need (measured: tiny, 0.3 ms a
batch, served at half the rate with two threads a worker). A worker started without the zygote
has no count and keeps the threads its spec gives it.
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


PARALLEL_WORTH = 0.005  # CPU seconds a batch must take before it gets more than one thread
SMOOTHING = 0.2  # weight of the newest batch in the worker's recent batch cost


class Threads:
    """One worker's torch threads, re-set only when its share of the cores changes."""

    def __init__(self, cores: int | None) -> None:
        self.cores = cores  # None: on a GPU, or told nothing: torch's own choice stands
        self.now: int | None = None
        self.cost: float | None = None  # recent CPU seconds of a batch (wall x threads)

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
        if _busy is None:
            self.set(self.cores)
            yield
            return
        with _busy.get_lock():
            _busy.value += 1
            busy = _busy.value
        share = max(1, self.cores // busy)
        self.set(share if self.cost is None or self.cost >= PARALLEL_WORTH else 1)
        started = time.perf_counter()
        try:
            yield
        finally:
            with _busy.get_lock():
                _busy.value -= 1
            cost = (time.perf_counter() - started) * (self.now or 1)
            self.cost = cost if self.cost is None else self.cost + SMOOTHING * (cost - self.cost)
