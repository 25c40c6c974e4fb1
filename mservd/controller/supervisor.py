"""Backend worker processes: spawn, stop, reap, and restart with back-off.

The supervisor knows processes, not requests: the controller hands it model versions and asks
it to make the live workers match each version's target. Workers are forks of the zygote
(:mod:`mservd.worker.zygote`, which has imported torch once; never a fork of the controller, which
holds a ZeroMQ context). The supervisor gives each a device (``cuda:<gpu_id>`` round-robin, or
a share of the CPU cores) and sends its stdout and stderr to the model's log file.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mservd.controller.zygote_client import Zygote
from mservd.core.worker_handle import WorkerHandle, WorkerState
from mservd.process.lifeline import EXIT_LOAD_FAILED
from mservd.specs import WorkerSpec

if TYPE_CHECKING:
    from mservd.core.registry import ModelVersion

log = logging.getLogger(__name__)


def backoff_delay(failures: int) -> float:
    """1, 1, 2, 3, 5, 8 … seconds after consecutive failures, capped at a minute."""
    a, b = 1, 1
    for _ in range(max(0, failures - 1)):
        a, b = b, a + b
    return float(min(a, 60))


@dataclass
class RestartState:
    failures: int = 0
    next_spawn_at: float = 0.0
    ever_loaded: bool = False
    failed: bool = False


class Supervisor:
    def __init__(
        self,
        endpoint: str,
        log_dir: Path,
        gpu_count: int,
        send_stop: Callable[[WorkerHandle], None],
        worker_spec_extra: dict[str, Any] | None = None,
        zygote: Zygote | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.log_dir = log_dir
        self.gpu_count = gpu_count
        self.send_stop = send_stop
        self.spec_extra = worker_spec_extra or {}
        self.workers: dict[bytes, WorkerHandle] = {}
        self.restarts: dict[tuple[str, str], RestartState] = {}
        self._next_id = 9000
        self._next_gpu = 0
        self._logs: dict[str, Any] = {}
        self.zygote = zygote if zygote is not None else Zygote()  # started early, maybe

    def start(self) -> None:
        """Start the zygote: torch imports there while the frontends start."""
        if self.zygote.proc is None:
            self.zygote.start()

    # -- verbs ---------------------------------------------------------------

    def spawn_worker(self, mv: ModelVersion, total_workers: int) -> WorkerHandle:
        worker_id = str(self._next_id)
        self._next_id += 1
        gpu_id = self._pick_gpu(mv)
        cores = available_cores()
        spec = WorkerSpec(
            worker_id=worker_id,
            endpoint=self.endpoint,
            model_name=mv.name,
            version=mv.version,
            model_dir=str(mv.model_dir),
            manifest=mv.manifest,
            handler=mv.handler,
            batch_size=mv.settings.batch_size,
            gpu_id=gpu_id,
            # every core: it takes its share of them batch by batch (mservd/worker/cores.py)
            threads=cores if gpu_id is None else None,
            model_yaml=mv.model_yaml,
            continuous_batching=mv.settings.continuous_batching,
            direct_streams=not mv.settings.sequence_batching,
            **self.spec_extra,
        )
        proc = self.zygote.spawn(spec, self._log_for(mv.name).fileno())
        worker = WorkerHandle(worker_id, mv.name, mv.version, proc, gpu_id, mv=mv)
        self.workers[worker.identity] = worker
        mv.workers[worker.id] = worker
        log.info("spawning worker %s for %s/%s on %s", worker_id, mv.name, mv.version,
                 f"cuda:{gpu_id}" if gpu_id is not None else "cpu")
        return worker

    def on_ready(self, worker: WorkerHandle) -> bool:
        """The worker loaded its model; False if it was asked to stop meanwhile (it is)."""
        if worker.stop_requested:
            self._send_stop_or_term(worker)
            return False
        worker.state = WorkerState.SERVING
        self.record_ready(worker.mv)
        return True

    def stop_worker(self, worker: WorkerHandle, busy: bool) -> None:
        """Ask a worker to exit after its current batch; ``reap_workers`` collects it."""
        if worker.stop_requested:
            return
        worker.stop_requested = True
        if not busy:
            self._send_stop_or_term(worker)
        # a busy worker gets STOP when its batch comes back (finish_stop)

    def finish_stop(self, worker: WorkerHandle) -> None:
        """Called when a worker that was asked to stop has finished its batch."""
        self._send_stop_or_term(worker)

    def _send_stop_or_term(self, worker: WorkerHandle) -> None:
        was_starting = worker.state is WorkerState.STARTING
        worker.state = WorkerState.STOPPING
        if worker.proc.poll() is not None:
            return
        if was_starting:
            worker.proc.terminate()  # still loading: it reads no messages yet
        else:
            self.send_stop(worker)

    def kill_worker(self, worker: WorkerHandle, why: str) -> None:
        log.warning("killing worker %s (pid %s): %s", worker.id, worker.pid, why)
        if worker.proc.poll() is None:
            worker.proc.kill()

    def reap_workers(self, now: float) -> list[WorkerHandle]:
        """Collect exited workers (a crash schedules a restart after a back-off); the caller
        answers their in-flight requests."""
        dead = []
        for identity, worker in list(self.workers.items()):
            code = worker.proc.poll()
            if code is None:
                continue
            del self.workers[identity]
            mv = worker.mv
            mv.workers.pop(worker.id, None)
            dead.append(worker)
            if not worker.stop_requested:
                log.warning("worker %s (pid %s) of %s/%s exited unexpectedly: %s", worker.id,
                            worker.pid, worker.model, worker.version, describe_exit(code))
                self.record_crash(mv, code, now)
            if self.is_failed(mv) and not mv.load_error:
                mv.load_error = "The worker exited while loading the model (exit code 3)."
        return dead

    def time_out_starting(self, now: float) -> None:
        """Kill workers that have not loaded their model within startup_timeout."""
        for worker in list(self.workers.values()):
            limit = worker.mv.settings.startup_timeout
            if worker.state is WorkerState.STARTING and now - worker.spawned_at > limit:
                worker.mv.load_error = (f"The worker did not load the model within "
                                        f"startup_timeout ({limit} s).")
                self.kill_worker(worker, "startup_timeout passed")

    def reconcile(self, mv: ModelVersion, now: float, total_workers: int,
                  is_busy: Callable[[WorkerHandle], bool]) -> None:
        """Spawn or stop workers until the version's live pool matches its target; the
        surplus stopped are those still loading first, then idle ones, busy ones last."""
        state = self.restarts.setdefault(mv.key, RestartState())
        alive = [w for w in mv.workers.values() if not w.stop_requested]
        missing = mv.target_workers - len(alive)
        if missing > 0 and not state.failed and now >= state.next_spawn_at:
            for _ in range(missing):
                self.spawn_worker(mv, total_workers)
        elif missing < 0:
            def order(worker: WorkerHandle) -> int:
                if worker.state is WorkerState.STARTING:
                    return 0
                return 2 if is_busy(worker) else 1

            for worker in sorted(alive, key=order)[:-missing]:
                self.stop_worker(worker, is_busy(worker))

    def record_ready(self, mv: ModelVersion) -> None:
        state = self.restarts.setdefault(mv.key, RestartState())
        state.failures = 0
        state.ever_loaded = True
        state.failed = False

    def record_crash(self, mv: ModelVersion, code: int, now: float) -> None:
        """Schedule the next spawn after a back-off; a model that never loaded is FAILED."""
        state = self.restarts.setdefault(mv.key, RestartState())
        if code == EXIT_LOAD_FAILED and not state.ever_loaded:
            state.failed = True
            return
        state.failures += 1
        state.next_spawn_at = now + backoff_delay(state.failures)

    def is_failed(self, mv: ModelVersion) -> bool:
        state = self.restarts.get(mv.key)
        return bool(state and state.failed)

    def forget(self, mv: ModelVersion) -> None:
        self.restarts.pop(mv.key, None)

    def terminate_all(self, grace: float) -> None:
        """TERM every worker, wait up to ``grace`` seconds, then KILL the rest."""
        self.zygote.stop(grace)
        self.workers.clear()
        for handle in self._logs.values():
            handle.close()

    # -- helpers -------------------------------------------------------------

    def _pick_gpu(self, mv: ModelVersion) -> int | None:
        if mv.settings.device_type == "cpu" or self.gpu_count <= 0:
            return None
        ids = list(mv.settings.device_ids) or list(range(self.gpu_count))
        gpu = ids[self._next_gpu % len(ids)]
        self._next_gpu += 1
        return gpu

    def _log_for(self, model: str):
        handle = self._logs.get(model)
        if handle is None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            # kept open while the model is served: each of its workers writes to it
            handle = open(self.log_dir / f"model_{model}.log", "ab", buffering=0)  # noqa: SIM115
            self._logs[model] = handle
        return handle


def describe_exit(code: int | None) -> str:
    if code is None:  # not reaped: no code to tell
        return "exited"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        hint = " (perhaps out of memory?)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    if code == EXIT_LOAD_FAILED:
        return "exit code 3 (the handler failed to load)"
    return f"exit code {code}"


def available_cores() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup quota (a container limit)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def detect_gpus() -> int:
    """GPUs this daemon may use, found without importing torch into the controller."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
