"""The controller's handle on one backend worker process: its process, state and batch.

Kept apart from the supervisor (which starts and stops these) and the registry (which lists
each version's) so that neither imports the other.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from mservd.zygote import Child


class WorkerState(enum.Enum):
    STARTING = "STARTING"
    IDLE = "IDLE"
    BUSY = "BUSY"
    STOPPING = "STOPPING"


@dataclass(eq=False)
class Worker:
    id: str
    model: str
    version: str
    proc: Child
    gpu_id: int | None
    started: float = field(default_factory=time.time)
    spawned_at: float = field(default_factory=time.monotonic)
    state: WorkerState = WorkerState.STARTING
    batch: dict[bytes, Any] = field(default_factory=dict)
    batch_deadline: float = 0.0
    batch_started: float = 0.0
    stop_requested: bool = False
    mv: Any = None  # the ModelVersion served; set by spawn_worker

    @property
    def identity(self) -> bytes:
        return self.id.encode()

    @property
    def pid(self) -> int | None:
        """None until the zygote has forked it (it may still be importing torch)."""
        return self.proc.pid

    @property
    def is_serving(self) -> bool:
        """Loaded and not stopping: it runs batches (idle or busy now); "READY" in describe."""
        return self.state in (WorkerState.IDLE, WorkerState.BUSY) and not self.stop_requested
