"""Prometheus text for ``GET /metrics``, rendered from the controller's own counts.

Counting happens in the controller (once per request, however many frontends there are); this
module only formats. It covers the per-model gauges and TorchServe's request counters.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mservd.controller import Controller

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RequestCounts:
    """What the controller counts per request: cheap integer adds on the hot path."""

    def __init__(self) -> None:
        self.accepted: Counter[tuple[str, str]] = Counter()
        self.by_class: Counter[str] = Counter()
        self.batches: Counter[tuple[str, str, int]] = Counter()
        self.restarts: Counter[tuple[str, str]] = Counter()


def _labels(name: str, version: str) -> str:
    return f'model_name="{name}",model_version="{version}"'


def render(ctl: Controller) -> str:
    counts = ctl.counts
    lines = [
        "# HELP ts_inference_requests_total Requests accepted into a model's queue.",
        "# TYPE ts_inference_requests_total counter",
    ]
    for (name, version), n in sorted(counts.accepted.items()):
        lines.append(f"ts_inference_requests_total{{{_labels(name, version)}}} {n}")
    for cls in ("2XX", "4XX", "5XX"):
        lines += [f"# HELP Requests{cls} Answers with a {cls} status.",
                  f"# TYPE Requests{cls} counter",
                  f"Requests{cls} {counts.by_class[cls]}"]
    lines += ["# HELP mservd_pending_requests Requests waiting in a model's queue.",
              "# TYPE mservd_pending_requests gauge"]
    versions = ctl.registry.all_versions()
    for mv in versions:
        lines.append(f"mservd_pending_requests{{{_labels(mv.name, mv.version)}}} {len(mv.batcher)}")
    lines += ["# HELP mservd_live_workers Workers ready to serve a model version.",
              "# TYPE mservd_live_workers gauge"]
    for mv in versions:
        lines.append(f"mservd_live_workers{{{_labels(mv.name, mv.version)}}} {mv.live_count()}")
    lines += ["# HELP mservd_worker_restarts_total Workers of a version that died unasked.",
              "# TYPE mservd_worker_restarts_total counter"]
    for (name, version), n in sorted(counts.restarts.items()):
        lines.append(f"mservd_worker_restarts_total{{{_labels(name, version)}}} {n}")
    lines += ["# HELP mservd_batches_total Batches run, by batch size.",
              "# TYPE mservd_batches_total counter"]
    for (name, version, size), n in sorted(counts.batches.items()):
        lines.append(f'mservd_batches_total{{{_labels(name, version)},batch_size="{size}"}} {n}')
    return "\n".join(lines) + "\n"
