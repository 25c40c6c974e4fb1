"""The daemon at a glance: the one JSON document the dashboard draws and scripts read.

Built by the controller when it is asked (``GET /dashboard/overview``, or once a second per
open dashboard stream), from state it keeps anyway: nothing is sampled while no one looks.
Counters and histograms are running totals, as in ``/metrics``: a reader takes rates and
quantiles from the difference between two documents (the dashboard's script does).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from mservd import __version__
from mservd.core.advisor import advise, curve
from mservd.core.traffic import version_state

if TYPE_CHECKING:
    from mservd.controller.supervisor import Supervisor
    from mservd.core.metrics import Metrics
    from mservd.core.registry import ModelVersion, Registry
    from mservd.core.scheduler import Scheduler


def document(registry: Registry, scheduler: Scheduler, supervisor: Supervisor,
             metrics: Metrics, started_at: float, now: float) -> dict[str, Any]:
    """The overview of every model version, the frontends, refusals and recent events."""
    histograms = {name: metrics.histograms(name) for name in
                  ("latency", "batch", "first_part", "between_parts")}
    return {
        "time": time.time(),
        "version": __version__,
        "uptimeSeconds": round(time.time() - started_at, 3),
        "frontends": {kind: {"restarts": count}
                      for kind, count in metrics.frontend_restart_counts().items()},
        "answers": metrics.answer_classes(),
        "refused": dict(metrics.refused),
        "models": [_version(registry, scheduler, supervisor, metrics, mv, histograms, now)
                   for mv in registry.all_versions()],
        "events": list(metrics.events),
    }


def _version(registry: Registry, scheduler: Scheduler, supervisor: Supervisor,
             metrics: Metrics, mv: ModelVersion, histograms: dict[str, dict],
             now: float) -> dict[str, Any]:
    workers = []
    for worker in sorted(mv.workers.values(), key=lambda w: int(w.id)):
        workers.append({
            "id": worker.id, "pid": worker.pid, "memoryBytes": worker.memory_bytes(),
            "status": worker.status,
            "device": worker.device, "deviceMemoryBytes": worker.device_memory,
            "kvCacheTokens": None if worker.kv_cache is None else {
                "used": worker.kv_cache[0], "capacity": worker.kv_cache[1]},
            "startedAt": worker.started,
        })
    if supervisor.is_failed(mv):
        state = "FAILED"
    elif mv.live_count():
        state = "READY"
    else:
        state = "LOADING" if mv.target_workers else "STOPPED"
    key = mv.key
    fit = mv.batch_costs.fit()
    vm = metrics.version(key)
    out: dict[str, Any] = {
        "name": mv.name, "version": mv.version, "state": state,
        "isDefault": registry.default_version(mv.name) == mv.version,
        "generative": mv.settings.continuous_batching,
        "settings": mv.settings_document(),
        "workers": workers,
        "restarts": vm.restart_count,
        "queue": {"pending": len(mv.batcher), "capacity": mv.batcher.capacity,
                  "oldestWaitSeconds": round(mv.batcher.oldest_wait(now), 6)},
        "running": scheduler.running_requests(mv),
        "answers": {str(status): n for status, n in sorted(vm.answers.items())},
        "latency": histograms["latency"].get(key),
        "batchSize": histograms["batch"].get(key),
        "batchCost": None, "advice": None,
    }
    if fit is not None:
        measured = mv.batch_costs.measured()
        out["batchCost"] = {**fit.to_dict(), "curve": curve(fit),
                            "measured": [m.to_dict() for m in measured.values()]}
        out["advice"] = advise(fit, mv.settings.latency_target, mv.largest_batch(),
                               measured).to_dict()
    if mv.settings.continuous_batching:
        out["firstToken"] = histograms["first_part"].get(key)
        out["interToken"] = histograms["between_parts"].get(key)
    policy = registry.traffic(mv.name)
    if policy is not None and mv.version in policy.versions():  # its p99 and errors beside
        out["traffic"] = version_state(mv.version, mv.live_count(), policy,  # the others'
                                       scheduler.traffic.health.get(key), now)
    if mv.load_error:
        out["loadError"] = mv.load_error
    return out
