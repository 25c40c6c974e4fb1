"""The model registry: name → versions → settings, queue and workers, and a default version.

Pure bookkeeping owned by the controller; it imports neither ZeroMQ nor Flask and does no IO.
Lookups raise the client-facing errors with the wording users see.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mservd.core.advisor import LARGEST_BATCH, BatchCosts
from mservd.core.batcher import Batcher
from mservd.core.sequences import SequenceQueue
from mservd.core.spinning import Spin
from mservd.errors import Forbidden, ModelNotFound, ModelVersionNotFound

if TYPE_CHECKING:
    from mservd.config import ModelSettings
    from mservd.core.traffic import TrafficPolicy
    from mservd.core.worker_handle import WorkerHandle


@dataclass
class ModelVersion:
    """One loaded version of a model: its settings, its queue and its worker pool."""

    name: str
    version: str
    url: str
    model_dir: Path
    manifest: dict[str, Any]
    settings: ModelSettings
    model_yaml: dict[str, Any]
    loaded_at_startup: bool = False
    owns_model_dir: bool = True  # an unpacked archive goes with the version; a user's folder stays
    handler_override: str | None = None  # a handler the register call named over the archive's
    workflow: str | None = None  # the workflow whose node this version is: only it removes it
    target_workers: int = 0
    max_workers: int = 0
    workers: dict[str, WorkerHandle] = field(default_factory=dict)
    load_error: str | None = None
    registered_at: float = field(default_factory=time.time)
    batch_seconds: float = 0.0  # recent time a worker takes for one batch (moving average)
    batcher: Batcher | SequenceQueue = field(init=False)  # a stateful model's: SequenceQueue
    batch_costs: BatchCosts = field(init=False)  # the advisor's recent batch timings
    batches_since_sized: int = 0  # batchSize: auto re-sizes every SIZE_EVERY batches ...
    sized_at: float = 0.0  # ... SIZE_INTERVAL apart at least (monotonic seconds)
    held: deque[int] = field(default_factory=lambda: deque(maxlen=16))  # requests it held
    # (queued and running) as each of its last batches ended: what its workers could batch
    target_spin: Spin = field(default_factory=Spin)  # its latency target's refusals, answers

    def __post_init__(self) -> None:
        s = self.settings
        if s.sequence_batching:
            self.batcher = SequenceQueue(
                f"Model {self.name} version {self.version}", s.batch_size,
                s.max_batch_delay / 1000.0, s.job_queue_size, s.max_num_sequence,
                s.max_sequence_job_queue_size, s.sequence_max_idle_ms / 1000.0,
                s.sequence_timeout_ms / 1000.0)
        else:
            self.batcher = Batcher(s.batch_size, s.max_batch_delay / 1000.0, s.job_queue_size)
        self.batch_costs = BatchCosts()
        self.target_workers = s.min_workers
        self.max_workers = s.max_workers

    @property
    def queue(self) -> Batcher:
        """The queue of a version without sequences (``sequence_batching`` off)."""
        assert isinstance(self.batcher, Batcher), "a stateful version queues by sequence"
        return self.batcher

    @property
    def sequences(self) -> SequenceQueue:
        """The queue of a stateful version (``sequence_batching`` on)."""
        assert isinstance(self.batcher, SequenceQueue), "this version has no sequences"
        return self.batcher

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.version)

    @property
    def handler(self) -> str:
        return (self.manifest.get("model") or {}).get("handler") or ""

    def settings_document(self) -> dict[str, Any]:
        """Its settings under TorchServe's camelCase names, as describe and snapshots show them
        (model-config.yaml spells them the same way)."""
        s = self.settings
        document: dict[str, Any] = {"minWorkers": self.target_workers, "maxWorkers": self.max_workers,
                    "batchSize": s.batch_size, "maxBatchDelay": s.max_batch_delay,
                    "responseTimeout": s.response_timeout, "startupTimeout": s.startup_timeout}
        if s.continuous_batching:
            document["continuousBatching"] = True
        if s.auto_batch:
            document["batchSize"] = "auto"
            document["batchSizeNow"] = self.batcher.batch_size
            document["maxBatchDelayNow"] = round(self.batcher.max_batch_delay * 1000.0, 3)
        if s.max_latency_ms:
            document["maxLatencyMs"] = s.max_latency_ms
        if s.sequence_batching:
            document.update({"sequenceBatching": True, "maxNumSequence": s.max_num_sequence,
                             "maxSequenceJobQueueSize": s.max_sequence_job_queue_size,
                             "sequenceMaxIdleMSec": s.sequence_max_idle_ms,
                             "sequenceTimeoutMSec": s.sequence_timeout_ms})
        return document

    def live_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.is_serving)

    def largest_batch(self) -> int:
        """The largest batch to advise: with batchSize: auto, no more than the live workers'
        share of the most requests it held over its last batches — a larger one gives one
        worker everything while the others wait, which a measure per worker cannot show."""
        if not self.settings.auto_batch or not self.held:
            return LARGEST_BATCH
        share = -(-max(self.held) // max(1, self.live_count()))  # rounded up
        return max(1, min(LARGEST_BATCH, share))


@dataclass
class ModelEntry:
    versions: dict[str, ModelVersion] = field(default_factory=dict)
    default_version: str | None = None
    traffic: TrafficPolicy | None = None  # versions sharing its unversioned requests


class Registry:
    def __init__(self) -> None:
        self._models: dict[str, ModelEntry] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._models

    def names(self) -> list[str]:
        return sorted(self._models)

    def all_versions(self) -> list[ModelVersion]:
        return [mv for entry in self._models.values() for mv in entry.versions.values()]

    def has_version(self, name: str, version: str) -> bool:
        entry = self._models.get(name)
        return entry is not None and version in entry.versions

    def add(self, mv: ModelVersion, make_default: bool = False) -> None:
        entry = self._models.setdefault(mv.name, ModelEntry())
        entry.versions[mv.version] = mv
        if make_default or entry.default_version is None:
            entry.default_version = mv.version

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The named version, or the default one when ``version`` is None."""
        entry = self._models.get(name)
        if entry is None:
            raise ModelNotFound(f"Model not found: {name}")
        if version is None:
            version = entry.default_version
        mv = entry.versions.get(version) if version is not None else None
        if mv is None:
            raise ModelVersionNotFound(
                f"Model version: {version} does not exist for model: {name}")
        return mv

    def default_version(self, name: str) -> str | None:
        entry = self._models.get(name)
        return entry.default_version if entry else None

    def versions(self, name: str) -> list[ModelVersion]:
        entry = self._models.get(name)
        if entry is None:
            raise ModelNotFound(f"Model not found: {name}")
        return [entry.versions[v] for v in sorted(entry.versions, key=_version_key)]

    def traffic(self, name: str) -> TrafficPolicy | None:
        """How the model's unversioned requests are shared among its versions (None: all go
        to the default version)."""
        entry = self._models.get(name)
        return entry.traffic if entry is not None else None

    def set_traffic(self, name: str, policy: TrafficPolicy | None) -> None:
        if name not in self._models:
            raise ModelNotFound(f"Model not found: {name}")
        self._models[name].traffic = policy

    def set_default(self, name: str, version: str) -> None:
        self.get(name, version)
        self._models[name].default_version = version

    def remove(self, name: str, version: str | None,
               workflow: str | None = None) -> ModelVersion:
        """Drop one version; the default may go only when it is the last one, and a
        workflow's node only when that ``workflow`` is unregistered."""
        mv = self.get(name, version)
        if mv.workflow is not None and mv.workflow != workflow:
            raise Forbidden(f"Model {name} belongs to workflow {mv.workflow}; unregister the "
                            "workflow.")
        entry = self._models[name]
        if mv.version == entry.default_version and len(entry.versions) > 1:
            raise Forbidden(
                f"Cannot remove default version {mv.version} for model {name}. "
                "Set another version as default first."
            )
        if entry.traffic is not None and mv.version in entry.traffic.versions():
            raise Forbidden(
                f"Cannot remove version {mv.version} of model {name}: its traffic policy names "
                f"it. Change it with PUT /models/{name}/traffic, or DELETE it, first."
            )
        del entry.versions[mv.version]
        if not entry.versions:
            del self._models[name]
        return mv


def _version_key(version: str) -> tuple:
    """Sort ``1.10`` after ``1.9``; fall back to text for versions that are not numbers."""
    parts = []
    for piece in version.replace("-", ".").split("."):
        parts.append((0, int(piece), "") if piece.isdigit() else (1, 0, piece))
    return tuple(parts)
