"""What the management verbs may use of the controller, and nothing more; and the one rule
every verb that adds workers checks."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mservd import protocol
from mservd.errors import BadRequest
from mservd.protocol import Reply

if TYPE_CHECKING:
    from mservd.auth import KeyStore
    from mservd.config import Settings
    from mservd.controller.supervisor import Supervisor
    from mservd.controller.waiter import Waiter
    from mservd.controller.workflows import Workflows
    from mservd.core.metrics import Metrics
    from mservd.core.registry import ModelVersion, Registry
    from mservd.core.scheduler import Scheduler

Respond = Callable[[Reply], None]  # how a verb answers later


class ModelService(Protocol):
    """What the management verbs may use of the controller, and nothing more."""

    settings: Settings
    registry: Registry
    supervisor: Supervisor
    keys: KeyStore | None
    metrics: Metrics
    scheduler: Scheduler
    started_at: float  # time.time() when the controller was made
    run_dir: Path  # this daemon's run folder: unpacked archives, sockets
    loading: set[tuple[str, str]]  # (name, version) of archives being unpacked
    gpu_count: int  # the GPUs workers are placed on (0: the CPU)
    workflows: Workflows  # the registered workflows (workflows.py)

    def submit(self, fn: Callable[..., Any], done: Callable[[Future], None],
               *args: Any) -> None: ...

    def wait_for(self, waiter: Waiter) -> None: ...

    def retire(self, mv: ModelVersion) -> None: ...

    def default_changed(self, name: str) -> None: ...

    def inference_key_changed(self) -> None: ...

    def reconcile_pools(self, now: float) -> None: ...

    def registry_changed(self) -> None: ...

    def healthy(self) -> bool: ...

    def ask_handler(self, mv: ModelVersion, frames: list[bytes],
                    answer: Callable[[protocol.Result], None]) -> None: ...


def check_total_workers(ctl: ModelService, wanted: int,
                        besides: ModelVersion | None = None) -> None:
    """400 unless ``wanted`` more workers (in place of ``besides``'s) fit in
    max_workers_total: a call must not fork workers past what the machine was sized for."""
    others = sum(mv.target_workers for mv in ctl.registry.all_versions()
                 if mv is not besides)
    cap = ctl.settings.max_workers_total
    if others + wanted > cap:
        raise BadRequest(f"{wanted} workers would make {others + wanted} in all, more than "
                         f"max_workers_total ({cap}); {others} are taken by other models.")
