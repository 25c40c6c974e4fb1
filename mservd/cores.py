"""Intra-op threads that follow the work: a lone busy worker uses every core, several share them.

Giving each of N workers cores/N threads for good wastes the machine whenever fewer are busy
(one request at a time runs on one core of two). So the workers on a host share one count of
those running a batch right now — an integer in anonymous shared memory that the zygote makes
before its first fork, so every worker it forks holds the same one — and before each batch a
CPU worker takes ``cores // busy`` torch threads (at least one). A worker started without the
zygote has no count and keeps the threads its spec gives it.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_busy: Any = None  # the shared count, made by share() in the zygote


def share() -> None:
    """In the zygote, before it forks: make the count its workers will share."""
    global _busy
    if _busy is None:
        _busy = multiprocessing.get_context("fork").Value("i", 0)


class Threads:
    """One worker's torch threads, re-set only when its share of the cores changes."""

    def __init__(self, cores: int | None) -> None:
        self.cores = cores  # None: on a GPU, or told nothing: torch's own choice stands
        self.now: int | None = None

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
        try:
            self.set(max(1, self.cores // busy))
            yield
        finally:
            with _busy.get_lock():
                _busy.value -= 1
