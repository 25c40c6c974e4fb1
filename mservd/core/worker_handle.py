"""The controller's handle on one backend worker process: its process and its life.

The supervisor alone changes a worker's state (starting, serving, stopping); what a serving
worker is running is the scheduler's to know. Kept apart from the supervisor and the registry
(which lists each version's workers) so that neither imports the other.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Protocol


class WorkerProcess(Protocol):
    """A worker's process as the supervisor drives it: ``subprocess.Popen``'s face, which the
    zygote's ``Child`` (``mservd/controller/zygote_client.py``) has."""

    pid: int | None
    returncode: int | None  # set once it has exited

    def poll(self) -> int | None: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class WorkerState(enum.Enum):
    STARTING = "STARTING"  # forked, loading its model
    SERVING = "SERVING"  # loaded: runs the batches the scheduler sends
    STOPPING = "STOPPING"  # asked to exit (after its batch, if it runs one)


@dataclass(eq=False)
class WorkerHandle:
    id: str
    model: str
    version: str
    proc: WorkerProcess
    gpu_id: int | None
    started: float = field(default_factory=time.time)
    spawned_at: float = field(default_factory=time.monotonic)
    state: WorkerState = WorkerState.STARTING
    stop_requested: bool = False
    device_memory: int | None = None  # bytes its PyTorch allocator holds on its GPU, as reported
    kv_cache: tuple[int, int] | None = None  # its KV cache's (used, capacity) tokens, as reported
    mv: Any = None  # the ModelVersion served; set by spawn_worker
    job_endpoint: str | None = None  # its job socket (READY), where a lent worker takes batches

    @property
    def identity(self) -> bytes:
        return self.id.encode()

    @property
    def pid(self) -> int | None:
        """None until the zygote has forked it (it may still be importing torch)."""
        return self.proc.pid

    @property
    def is_serving(self) -> bool:
        """Loaded and not asked to stop: it runs batches; "READY" in describe."""
        return self.state is WorkerState.SERVING and not self.stop_requested

    @property
    def status(self) -> str:
        """As describe and the dashboard show it: READY, STOPPING, STARTING."""
        if self.is_serving:
            return "READY"
        return "STOPPING" if self.stop_requested else self.state.value

    @property
    def device(self) -> str:
        return "cpu" if self.gpu_id is None else f"cuda:{self.gpu_id}"

    def gpu_usage(self) -> str:
        """TorchServe's describe field: ``gpuId::N memory.used [MiB]::M`` (the memory its
        PyTorch allocator holds, once the worker has reported it), or N/A on the CPU."""
        if self.gpu_id is None:
            return "N/A"
        if self.device_memory is None:
            return f"gpuId::{self.gpu_id}"
        return f"gpuId::{self.gpu_id} memory.used [MiB]::{self.device_memory / 2**20:.0f}"

    def memory_bytes(self) -> int:
        """Its resident memory now (0 before it is forked or after it is gone)."""
        import psutil

        try:
            return psutil.Process(self.pid).memory_info().rss if self.pid else 0
        except psutil.Error:
            return 0
