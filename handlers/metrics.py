"""Recording the metrics a handler emits, with TorchServe's handler-side API.

This module owns :class:`MetricsRecorder`, the object a handler finds at ``context.metrics``:
``add_time``, ``add_counter``, ``add_size``, ``add_percent``, ``add_error``, ``add_metric``,
``add_metric_to_cache`` and ``get_metric`` each record :class:`MetricSample` values into a list.
It does no IO: the worker calls :meth:`MetricsRecorder.drain` after each batch and ships the
samples to the controller, which owns aggregation and the Prometheus endpoint.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


class MetricTypes(str, enum.Enum):
    """The kinds of metric TorchServe knows; names and values match ``ts.metrics.metric_type_enum``."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class MetricSample:
    """One recorded value.

    :param dimensions: dimension name → value, including the defaults ``ModelName`` and ``Level``.
    """

    name: str
    value: float
    unit: str
    kind: MetricTypes
    dimensions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Dimension:
    """A metric dimension as TorchServe handlers build them (``ts.metrics.dimension``)."""

    name: str
    value: str

    def __str__(self) -> str:
        return f"{self.name}:{self.value}"


DimensionsArg = Mapping[str, Any] | Iterable[Any] | None


def _dimensions(dimensions: DimensionsArg) -> dict[str, str]:
    """Dimensions as a dict, from a dict, ``(name, value)`` pairs or TorchServe ``Dimension`` objects."""
    if dimensions is None:
        return {}
    if isinstance(dimensions, Mapping):
        return {str(k): str(v) for k, v in dimensions.items()}
    # Pairs or Dimension objects here: mypy keeps Mapping[str, Any] in the union after the
    # isinstance check above, and would take each entry for a str key.
    entries: Iterable[Any] = dimensions
    result: dict[str, str] = {}
    for dim in entries:
        if hasattr(dim, "name") and hasattr(dim, "value"):
            result[str(dim.name)] = str(dim.value)
        else:
            name, value = dim
            result[str(name)] = str(value)
    return result


# The model metrics TorchServe's default metrics.yaml declares (without a metrics_config):
# each handler's get_metric finds them.
TORCHSERVE_MODEL_METRICS: tuple[Mapping[str, Any], ...] = (
    {"name": "HandlerTime", "unit": "ms", "dimensions": ["ModelName", "Level"], "type": "gauge"},
    {"name": "PredictionTime", "unit": "ms", "dimensions": ["ModelName", "Level"],
     "type": "gauge"},
)


class Metric:
    """A declared metric, as returned by ``add_metric_to_cache`` and ``get_metric``.

    :param dimension_names: the names that ``add_or_update``'s ``dimension_values`` fill, in order.
    """

    def __init__(
        self,
        recorder: MetricsRecorder,
        name: str,
        unit: str,
        dimension_names: list[str],
        kind: MetricTypes,
    ) -> None:
        self.recorder = recorder
        self.name = name
        self.unit = unit
        self.dimension_names = dimension_names
        self.metric_type = kind

    def add_or_update(
        self, value: float, dimension_values: list[str] | None = None, request_id: str = ""
    ) -> None:
        """Record ``value`` with the declared dimensions set to ``dimension_values``."""
        values = list(dimension_values or [])
        if len(values) != len(self.dimension_names):
            # TorchServe logs a wrong update and goes on: a metric never fails a request
            logger.error("Metric %r has dimensions %r but got values %r; pass one value per "
                         "dimension name. Not recorded.", self.name, self.dimension_names, values)
            return
        if self.metric_type == MetricTypes.COUNTER and value < 0:
            logger.error("Counter %r cannot go down by %r. Not recorded.", self.name, value)
            return
        self.recorder.record(
            self.name, value, self.unit, self.metric_type, dict(zip(self.dimension_names, values))
        )

    def update(self, value: float, request_id: str = "", dimensions: DimensionsArg = None) -> None:
        """Record ``value`` with explicit dimensions (TorchServe's older call)."""
        self.recorder.record(self.name, value, self.unit, self.metric_type, _dimensions(dimensions))


class MetricsRecorder:
    """Collects :class:`MetricSample` values until :meth:`drain` takes them.

    :param model_name: added to every sample as the ``ModelName`` dimension, with ``Level: Model``,
        as TorchServe does for handler metrics.
    """

    def __init__(self, model_name: str | None = None,
                 declarations: Iterable[Mapping[str, Any]] | None = None) -> None:
        self._defaults = {"ModelName": model_name, "Level": "Model"} if model_name else {}
        self._samples: list[MetricSample] = []
        self._declared: dict[tuple[str, MetricTypes], Metric] = {}
        # A handler may record from its own threads (streaming, async preprocessing).
        self._lock = threading.Lock()
        for d in TORCHSERVE_MODEL_METRICS if declarations is None else declarations:
            self.add_metric_to_cache(d["name"], d["unit"], list(d["dimensions"]), d["type"])

    def record(
        self,
        name: str,
        value: float,
        unit: str,
        kind: MetricTypes | str,
        dimensions: Mapping[str, str] | None = None,
    ) -> MetricSample:
        """Record one sample; every ``add_*`` method ends here."""
        sample = MetricSample(
            name=name,
            value=float(value),
            unit=unit,
            kind=MetricTypes(kind),
            dimensions={**self._defaults, **(dimensions or {})},
        )
        with self._lock:
            self._samples.append(sample)
            if (name, sample.kind) not in self._declared:  # get_metric finds it from now on
                self._declared[(name, sample.kind)] = Metric(
                    self, name, unit, list(sample.dimensions), sample.kind)
        return sample

    def drain(self) -> list[MetricSample]:
        """The samples recorded since the last drain, oldest first; the recorder is left empty."""
        with self._lock:
            samples, self._samples = self._samples, []
        return samples

    # TorchServe's handler API. ``idx`` (the request's position) is accepted for compatibility;
    # mservd reports handler metrics per model, not per request.

    def add_metric(
        self,
        name: str,
        value: float,
        unit: str = "ms",
        idx: int | None = None,
        dimensions: DimensionsArg = None,
        metric_type: MetricTypes | str = MetricTypes.COUNTER,
    ) -> None:
        self.record(name, value, unit, metric_type, _dimensions(dimensions))

    def add_counter(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        dimensions: DimensionsArg = None,
        metric_type: MetricTypes | str = MetricTypes.COUNTER,
    ) -> None:
        self.record(name, value, "count", metric_type, _dimensions(dimensions))

    def add_time(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        unit: str = "ms",
        dimensions: DimensionsArg = None,
        metric_type: MetricTypes | str = MetricTypes.GAUGE,
    ) -> None:
        if unit not in ("ms", "s", "us"):
            raise ValueError(f"Time unit {unit!r} is not one of 'ms', 's', 'us'.")
        self.record(name, value, unit, metric_type, _dimensions(dimensions))

    def add_size(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        unit: str = "MB",
        dimensions: DimensionsArg = None,
        metric_type: MetricTypes | str = MetricTypes.GAUGE,
    ) -> None:
        if unit not in ("MB", "kB", "GB", "B"):
            raise ValueError(f"Size unit {unit!r} is not one of 'MB', 'kB', 'GB', 'B'.")
        self.record(name, value, unit, metric_type, _dimensions(dimensions))

    def add_percent(
        self,
        name: str,
        value: float,
        idx: int | None = None,
        dimensions: DimensionsArg = None,
        metric_type: MetricTypes | str = MetricTypes.GAUGE,
    ) -> None:
        self.record(name, value, "percent", metric_type, _dimensions(dimensions))

    def add_error(self, name: str, value: float, dimensions: DimensionsArg = None) -> None:
        self.record(name, value, "", MetricTypes.COUNTER, _dimensions(dimensions))

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: list[str] | None = None,
        metric_type: MetricTypes | str = MetricTypes.COUNTER,
    ) -> Metric:
        """Declare a metric; record values later through the returned :class:`Metric`."""
        kind = MetricTypes(metric_type)
        metric = Metric(self, metric_name, unit, list(dimension_names or []), kind)
        self._declared[(metric_name, kind)] = metric
        return metric

    def get_metric(
        self, metric_name: str, metric_type: MetricTypes | str = MetricTypes.COUNTER
    ) -> Metric:
        """A metric declared by ``metrics_config``'s ``model_metrics`` (without one,
        TorchServe's own: ``HandlerTime`` and ``PredictionTime``), by
        :meth:`add_metric_to_cache`, or by a value recorded under its name."""
        kind = MetricTypes(metric_type)
        try:
            return self._declared[(metric_name, kind)]
        except KeyError:
            declared = sorted(f"{n} ({k.value})" for n, k in self._declared)
            raise KeyError(
                f"Metric {metric_name!r} of type {kind.value!r} was not declared. Declared: "
                f"{declared or 'none'}. Declare it with add_metric_to_cache, or under "
                "model_metrics in the metrics_config file."
            ) from None
