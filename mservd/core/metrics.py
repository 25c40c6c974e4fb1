"""The controller's metrics, in Prometheus form: TorchServe's names and the histograms beyond.

Counting happens in the controller, once per request however many frontends there are. Per
request it costs a few child-metric updates (children are looked up once per model version);
gauges that describe state (queue length, live workers, worker memory) are read only when
``/metrics`` is scraped. Handlers' own metrics arrive from the workers as samples and are
registered here on first sight, by name.
"""

from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mservd import protocol
from mservd.core.advisor import advise

if TYPE_CHECKING:
    from mservd.core.registry import ModelVersion, Registry
    from mservd.core.worker_handle import WorkerHandle

log = logging.getLogger(__name__)

MODEL = ("model_name", "model_version")
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                   10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
_NAME_OK = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
EVENTS = 100  # worker deaths and refusals the dashboard's log keeps

__all__ = ["CONTENT_TYPE", "Metrics"]


class VersionMetrics:
    """The labelled children of one model version, looked up once."""

    __slots__ = (
        "answers",
        "batch",
        "between_parts",
        "first_part",
        "handler",
        "latency",
        "latency_us",
        "leased",
        "prefix_hit_count",
        "prefix_hits",
        "queue",
        "queue_us",
        "requests",
        "restart_count",
        "restarts",
    )

    def __init__(self, m: Metrics, name: str, version: str) -> None:
        self.requests = m.requests.labels(name, version)
        self.latency_us = m.latency_us.labels(name, version)
        self.queue_us = m.queue_us.labels(name, version)
        self.latency = m.latency.labels(name, version)
        self.queue = m.queue.labels(name, version)
        self.handler = m.handler.labels(name, version)
        self.batch = m.batch.labels(name, version)
        self.restarts = m.restarts.labels(name, version)
        self.first_part = m.first_part.labels(name, version)
        self.between_parts = m.between_parts.labels(name, version)
        self.leased = m.leased.labels(name, version)
        self.prefix_hits = m.prefix_hits.labels(name, version)
        self.prefix_hit_count = 0  # the same, for describe
        self.answers: dict[int, int] = {}  # answers by HTTP status (the dashboard's errors)
        self.restart_count = 0

    def answered(self, status: int) -> None:
        self.answers[status] = self.answers.get(status, 0) + 1

    def worker_died(self) -> None:
        self.restarts.inc()
        self.restart_count += 1


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("ts_inference_requests", "Requests accepted into a model's "
                                "queue.", MODEL, registry=r)
        # TorchServe's names carry no _total suffix, which prometheus-client adds to every
        # Counter: these three are kept as ever-growing Gauges so dashboards find them.
        self.latency_us = Gauge("ts_inference_latency_microseconds", "Total time from a "
                                "request's arrival at the controller to its answer.", MODEL,
                                registry=r)
        self.queue_us = Gauge("ts_queue_latency_microseconds", "Total time requests waited "
                              "in a queue.", MODEL, registry=r)
        self.by_class = {cls: Gauge(f"Requests{cls}", f"Answers with a {cls} status.",
                                    registry=r) for cls in ("2XX", "4XX", "5XX")}
        self.latency = Histogram("mservd_request_latency_seconds", "Time from a request's "
                                 "arrival at the controller to its answer.", MODEL,
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("mservd_queue_latency_seconds", "Time a request waited in its "
                               "model's queue.", MODEL, buckets=LATENCY_BUCKETS, registry=r)
        self.handler = Histogram("mservd_batch_latency_seconds", "Time a worker took for one "
                                 "batch, from hand-over to answers.", MODEL,
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.batch = Histogram("mservd_batch_size", "Requests per batch run.", MODEL,
                               buckets=BATCH_BUCKETS, registry=r)
        self.leased = Counter("mservd_leased_requests", "Requests a frontend sent an idle "
                              "worker lent to it, past the queue (mservd/core/leases.py); counted "
                              "in ts_inference_requests too.", MODEL, registry=r)
        self.restarts = Counter("mservd_worker_restarts", "Workers of a version that died "
                                "unasked.", MODEL, registry=r)
        self.frontend_restarts = Counter("mservd_frontend_restarts", "Frontend processes "
                                         "that died unasked and were started again.",
                                         ("frontend",), registry=r)
        # workflows (/wfpredict): each run once, however many nodes it calls
        self.workflow_requests = Counter("mservd_workflow_requests", "Workflow runs answered, "
                                         "by their status class.", ("workflow_name", "status"),
                                         registry=r)
        self.workflow_latency = Histogram("mservd_workflow_latency_seconds", "Time from a "
                                          "workflow run's arrival to its answer.",
                                          ("workflow_name",), buckets=LATENCY_BUCKETS,
                                          registry=r)
        self.workflow_node_failures = Counter("mservd_workflow_node_failures", "Node calls of "
                                              "a workflow that failed (retried or not).",
                                              ("workflow_name", "node"), registry=r)
        self.pending = Gauge("mservd_pending_requests", "Requests waiting in a model's queue.",
                             MODEL, registry=r)
        # streamed answers (generation): time to the first part (token) and between parts
        self.first_part = Histogram("mservd_time_to_first_token_seconds", "Time from a "
                                    "request's arrival to the first part of its answer (the "
                                    "first token of a generation).", MODEL,
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.between_parts = Histogram("mservd_inter_token_latency_seconds", "Time between "
                                       "consecutive parts of a streamed answer (tokens).",
                                       MODEL, buckets=LATENCY_BUCKETS, registry=r)
        # a generation handler's KV cache (handlers/causal_lm.py), summed over the workers
        self.kv_usage = Gauge("mservd_kv_cache_usage_ratio", "The share of a model's KV cache "
                              "(all its workers) that running sequences hold.", MODEL,
                              registry=r)
        self.prefix_hits = Counter("mservd_prefix_cache_hit_tokens", "Prompt tokens found in "
                                   "the KV cache (prefix reuse) instead of computed again.",
                                   MODEL, registry=r)
        self.running = Gauge("mservd_running_requests", "Requests a model's workers are "
                             "running now (sequences, with continuous batching).", MODEL,
                             registry=r)
        self.live = Gauge("mservd_live_workers", "Workers ready to serve a model version.",
                          MODEL, registry=r)
        self.memory = Gauge("mservd_worker_memory_bytes", "Resident memory of each worker.",
                            (*MODEL, "worker_id"), registry=r)
        # the batching advisor's fit per version (mservd/core/advisor.py), set when scraped
        self.fixed_cost = Gauge("mservd_batch_fixed_cost_seconds", "The batching advisor's "
                                "fitted cost of a batch paid once (c in t(B) = c + m*B).", MODEL,
                                registry=r)
        self.item_cost = Gauge("mservd_batch_item_cost_seconds", "The batching advisor's fitted "
                               "cost per request of a batch (m in t(B) = c + m*B).", MODEL,
                               registry=r)
        self.fit_r2 = Gauge("mservd_batch_cost_fit_r2", "How well t(B) = c + m*B fits the recent "
                            "batch timings (1: exactly).", MODEL, registry=r)
        self.advised_batch = Gauge("mservd_advised_batch_size", "The batch size the batching "
                                   "advisor recommends.", MODEL, registry=r)
        self.batch_limit = Gauge("mservd_batch_size_limit", "The batch size a version's batcher "
                                 "takes now (set, or chosen by batchSize: auto).", MODEL,
                                 registry=r)
        # versions that share traffic (core/traffic.py)
        self.traffic_weight = Gauge("mservd_traffic_weight", "A version's share (percent) of its "
                                    "model's unversioned requests under its traffic policy.",
                                    MODEL, registry=r)
        self.traffic_excluded = Counter("mservd_traffic_excluded", "Requests routed past a "
                                        "weighted version left out of its model's traffic, by "
                                        "why: no_worker, error_rate (its breaker is open).",
                                        (*MODEL, "reason"), registry=r)
        self.traffic_trips = Counter("mservd_traffic_trips", "Times a version's 5xx rate passed "
                                     "its maxErrorRate and its traffic was taken away.", MODEL,
                                     registry=r)
        self.shadow_requests = Counter("mservd_shadow_requests", "Copies of requests for a "
                                       "shadow version, by outcome: sent, dropped (refused), "
                                       "ok or error (its answer, then discarded).",
                                       (*MODEL, "outcome"), registry=r)
        self._versions: dict[tuple[str, str], VersionMetrics] = {}
        self._custom: dict[str, Any] = {}
        # what the dashboard reads (mservd/controller/overview.py): totals kept as plain numbers
        self.classes = {"2XX": 0, "4XX": 0, "5XX": 0}
        self.refused: collections.Counter[str] = collections.Counter()
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=EVENTS)

    def version(self, key: tuple[str, str]) -> VersionMetrics:
        children = self._versions.get(key)
        if children is None:
            children = self._versions[key] = VersionMetrics(self, *key)
        return children

    def answered(self, status: int, vm: VersionMetrics | None = None) -> None:
        cls = f"{status // 100}XX"
        counter = self.by_class.get(cls)
        if counter is not None:
            counter.inc()
            self.classes[cls] += 1
        if vm is not None:
            vm.answered(status)

    def shadowed(self, name: str, version: str, outcome: str) -> None:
        self.shadow_requests.labels(name, version, outcome).inc()

    def event(self, kind: str, message: str, **fields: Any) -> None:
        """Remember a worker death or a refusal for the dashboard's log (the last EVENTS)."""
        self.events.append({"time": time.time(), "kind": kind, "message": message, **fields})

    def answer_classes(self) -> dict[str, int]:
        return dict(self.classes)

    def frontend_restart_counts(self) -> dict[str, float]:
        counts = {"http": 0.0, "grpc": 0.0}
        for metric in self.frontend_restarts.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["frontend"]] = sample.value
        return counts

    def histograms(self, name: str) -> dict[tuple[str, str], dict[str, Any]]:
        """One of the per-version histograms (``latency``, ``batch``, ``first_part``,
        ``between_parts``) as {(model, version): buckets (upper bounds, None for +Inf),
        cumulative counts, count, sum}."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for metric in getattr(self, name).collect():
            for sample in metric.samples:
                key = (sample.labels.get("model_name"), sample.labels.get("model_version"))
                doc = out.setdefault(key, {"buckets": [], "counts": [], "count": 0, "sum": 0.0})
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    doc["buckets"].append(None if bound == float("inf") else bound)
                    doc["counts"].append(int(sample.value))
                elif sample.name.endswith("_count"):
                    doc["count"] = int(sample.value)
                elif sample.name.endswith("_sum"):
                    doc["sum"] = sample.value
        return out

    def record_worker_samples(self, worker: WorkerHandle,
                              samples: list[protocol.Sample]) -> None:
        """A worker's METRICS: its device memory and KV cache figures are kept on its handle
        (for describe and the usage ratio), its prefix hits counted per version; the handler's
        own samples (the KV ones too, as TorchServe shows them) become handler metrics."""
        used, capacity = worker.kv_cache or (0, 0)
        for sample in samples:
            if sample.name == protocol.DEVICE_MEMORY:
                worker.device_memory = int(sample.value)
            elif sample.name == protocol.KV_USED:
                used = int(sample.value)
            elif sample.name == protocol.KV_CAPACITY:
                capacity = int(sample.value)
            elif sample.name == protocol.PREFIX_HITS and worker.mv is not None:
                vm = self.version(worker.mv.key)
                vm.prefix_hits.inc(max(0.0, sample.value))
                vm.prefix_hit_count += int(max(0.0, sample.value))
        if capacity:
            worker.kv_cache = (used, capacity)
        self.record_handler_samples([s for s in samples if s.name != protocol.DEVICE_MEMORY])

    def record_handler_samples(self, samples: list[protocol.Sample]) -> None:
        """Handler metrics shipped by a worker. A counter keeps its name, as TorchServe shows
        it (prometheus-client's Counter would add ``_total``): a gauge that only grows, like
        the ``ts_*`` ones."""
        for sample in samples:
            name, value, unit, kind, dimensions = (sample.name, sample.value, sample.unit,
                                                   sample.kind, sample.dimensions)
            labels = tuple(sorted(dimensions))
            if name not in self._custom:
                if not _NAME_OK.match(name) or name in self.registry._names_to_collectors:
                    log.warning("handler metric %r has an unusable name; dropped", name)
                    self._custom[name] = None
                    continue
                counter = kind == "counter"
                metric = (Histogram if kind == "histogram" else Gauge)(
                    name, f"Handler metric ({unit}{', a counter' if counter else ''}).",
                    labels, registry=self.registry)
                self._custom[name] = (metric, counter)
            known = self._custom[name]
            if known is None or tuple(known[0]._labelnames) != labels:
                continue  # unusable, or dimensions changed: Prometheus cannot mix them
            metric, counter = known
            child = metric.labels(*(dimensions[k] for k in labels)) if labels else metric
            if counter:
                child.inc(max(0.0, float(value)))
            elif isinstance(metric, Histogram):
                child.observe(float(value))
            else:
                child.set(float(value))

    def render(self, registry: Registry,
               running: Callable[[ModelVersion], int] = lambda mv: 0,
               names: Iterable[str] = ()) -> bytes:
        """The text for ``GET /metrics``: state gauges are read now. ``names``: only the
        samples of these names (TorchServe's ``?name[]=...``), else all."""
        import psutil

        for gauge in (self.pending, self.running, self.live, self.memory, self.batch_limit,
                      self.fixed_cost, self.item_cost, self.fit_r2, self.advised_batch,
                      self.kv_usage, self.traffic_weight):
            gauge.clear()  # a version unregistered since the last scrape shows no more
        for name in registry.names():
            policy = registry.traffic(name)
            if policy is not None:
                total = sum(policy.weights.values())
                for version, weight in policy.weights.items():
                    self.traffic_weight.labels(name, version).set(weight * 100.0 / total)
        for mv in registry.all_versions():
            self.pending.labels(mv.name, mv.version).set(len(mv.batcher))
            self.running.labels(mv.name, mv.version).set(running(mv))
            self.live.labels(mv.name, mv.version).set(mv.live_count())
            self.batch_limit.labels(mv.name, mv.version).set(mv.batcher.batch_size)
            kv = kv_cache_tokens(mv)
            if kv is not None:
                self.kv_usage.labels(mv.name, mv.version).set(kv[0] / kv[1])
            fit = mv.batch_costs.fit()
            if fit is not None:
                self.fixed_cost.labels(mv.name, mv.version).set(fit.fixed)
                self.item_cost.labels(mv.name, mv.version).set(fit.per_item)
                self.fit_r2.labels(mv.name, mv.version).set(fit.r2)
                self.advised_batch.labels(mv.name, mv.version).set(
                    advise(fit, mv.settings.latency_target, mv.largest_batch(),
                           mv.batch_costs.measured()).batch_size)
            for worker in mv.workers.values():
                if worker.pid is None:
                    continue
                try:
                    rss = psutil.Process(worker.pid).memory_info().rss
                except psutil.Error:
                    continue
                self.memory.labels(mv.name, mv.version, worker.id).set(rss)
        names = set(names)
        return generate_latest(self.registry.restricted_registry(names) if names
                               else self.registry)


def kv_cache_tokens(mv: ModelVersion) -> tuple[int, int] | None:
    """A version's KV cache over its live workers: (used, capacity) tokens; None when no
    worker reports one (not a generation handler, or none ready)."""
    held = [w.kv_cache for w in mv.workers.values() if w.kv_cache is not None and w.is_serving]
    capacity = sum(c for _, c in held)
    return (sum(u for u, _ in held), capacity) if capacity else None
