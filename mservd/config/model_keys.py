"""The keys a model version's settings are given by, in each place they come from (the
``models=`` block of ``config.properties``, ``model-config.yaml``, the management API), each
with the setting it sets and its converter; and converting one layer of them."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from mservd.config.convert import (
    Convert,
    Problems,
    above,
    at_least,
    between,
    chain,
    converter_for,
    to_bool,
    to_int,
)
from mservd.errors import short_repr


def _device_type(value: Any) -> str:
    if isinstance(value, str) and value.strip().lower() in ("cpu", "gpu"):
        return value.strip().lower()
    raise ValueError(f"{short_repr(value)} is not cpu or gpu")


def _device_ids(value: Any) -> tuple[int, ...]:
    items = [s for s in value.split(",") if s.strip()] if isinstance(value, str) else value
    bad = f"{short_repr(value)} is not a list of GPU ids"
    if isinstance(items, (list, tuple)):
        try:
            ids = tuple(to_int(item) for item in items)
        except ValueError:
            raise ValueError(bad) from None
        if any(i < 0 for i in ids):
            raise ValueError(f"{short_repr(value)} has a negative GPU id")
        return ids
    raise ValueError(bad)


_WORKERS = chain(to_int, at_least(0))
_BATCH = chain(to_int, at_least(1))


def _batch_size(value: Any) -> int | str:
    """A batch size, or ``auto``: sized by the batching advisor."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return _BATCH(value)


# camelCase key of model-config.yaml and the models= block → (ModelSettings field, converter)
MODEL_YAML_KEYS: Mapping[str, tuple[str, Convert]] = types.MappingProxyType(
    {
        "minWorkers": ("min_workers", _WORKERS),
        "maxWorkers": ("max_workers", _WORKERS),
        "batchSize": ("batch_size", _batch_size),
        "maxBatchDelay": ("max_batch_delay", chain(to_int, at_least(0))),
        "responseTimeout": ("response_timeout", chain(to_int, above(0))),
        "startupTimeout": ("startup_timeout", chain(to_int, above(0))),
        "jobQueueSize": ("job_queue_size", chain(to_int, at_least(1))),
        "maxLatencyMs": ("max_latency_ms", chain(to_int, above(0))),
        "deviceType": ("device_type", _device_type),
        "deviceIds": ("device_ids", _device_ids),
        "continuousBatching": ("continuous_batching", to_bool),
        "sequenceBatching": ("sequence_batching", to_bool),
        "maxNumSequence": ("max_num_sequence", chain(to_int, at_least(1))),
        "maxSequenceJobQueueSize": ("max_sequence_job_queue_size", chain(to_int, at_least(1))),
        "sequenceMaxIdleMSec": ("sequence_max_idle_ms", chain(to_int, at_least(0))),
        "sequenceTimeoutMSec": ("sequence_timeout_ms", chain(to_int, at_least(0))),
    }
)
# model-config.yaml keys TorchServe acts on that mservd does not: said once per model version
# at its start, so a user does not believe them applied (the handler still sees them all)
TORCHSERVE_KEYS_NOT_APPLIED = {
    "parallelType": "model parallelism (torchrun, DeepSpeed, PiPPy) is not run",
    "parallelLevel": "model parallelism is not run",
    "torchrun": "model parallelism is not run",
    "useJobTicket": "requests queue up to jobQueueSize instead",
    "clientTimeoutInMills": "send X-Request-Timeout-Ms, or set default_request_timeout_ms",
    "maxRetryTimeoutInSec": "a worker that dies is started again at once",
    "asyncCommunication": "answers go back as each batch ends",
    "useVenv": "handlers run in the daemon's environment",
}
MODELS_BLOCK_KEYS: Mapping[str, tuple[str, Convert]] = types.MappingProxyType(
    {**MODEL_YAML_KEYS, "defaultVersion": ("default_version", to_bool)}
)
# the models= block's keys of a version's share of its model's traffic (core/traffic.py;
# stickyTraffic true on any version makes the model's policy sticky), apart from the settings
# above: they make the model's policy, not the version's settings
_to_float = converter_for(float)
TRAFFIC_KEYS: Mapping[str, tuple[str, Convert]] = types.MappingProxyType(
    {
        "trafficWeight": ("weights", chain(_to_float, at_least(0))),
        "shadowPercent": ("shadow", chain(_to_float, between(0, 100))),
        "maxErrorRate": ("maxErrorRate", chain(_to_float, between(0, 1))),
        "stickyTraffic": ("sticky", to_bool),
    }
)
# the management API's query names (register and scale-workers calls)
API_KEYS: Mapping[str, tuple[str, Convert]] = types.MappingProxyType(
    {
        "min_worker": ("min_workers", _WORKERS),
        "max_worker": ("max_workers", _WORKERS),
        "initial_workers": ("min_workers", _WORKERS),
        "batch_size": ("batch_size", _batch_size),
        "max_batch_delay": ("max_batch_delay", chain(to_int, at_least(0))),
        "response_timeout": ("response_timeout", chain(to_int, above(0))),
        "startup_timeout": ("startup_timeout", chain(to_int, above(0))),
    }
)


def convert_layer(
    layer: Mapping[str, Any],
    keys: Mapping[str, tuple[str, Convert]],
    source: str,
    problems: list[str],
    origin: dict[str, str],
) -> dict[str, Any]:
    """The known keys of one layer, converted; unknown keys are someone else's (the handler's
    model_yaml_config, the API's url), and ``None`` means not given."""
    values: dict[str, Any] = {}
    for key, raw in layer.items():
        if key not in keys or raw is None:
            continue
        name, convert = keys[key]
        try:
            values[name] = convert(raw)
        except ValueError as exc:
            problems.append(f"{source} {key}: {exc}")
            continue
        origin[name] = f"{source} {key}"
    return values


def traffic_of_models_block(models: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The traffic policy documents the ``models=`` block gives (TRAFFIC_KEYS), by model;
    a model none of whose versions has a trafficWeight has none."""
    out: dict[str, dict[str, Any]] = {}
    for name, versions in models.items():
        document: dict[str, Any] = {"weights": {}, "sticky": False, "shadow": {},
                                    "maxErrorRate": {}}
        for version, entry in versions.items():
            values = convert_layer(entry, TRAFFIC_KEYS, f"model {name!r} version {version!r}",
                                   [], {})
            for field, value in values.items():
                if field == "sticky":
                    document["sticky"] = document["sticky"] or value
                else:
                    document[field][version] = value
        if document["weights"]:
            out[name] = document
    return out


def valid_models_block(value: dict[str, Any]) -> dict[str, Any]:
    """The ``models=`` block must be {name: {version: {setting: value}}}; values are checked too,
    so a bad entry is reported at start-up rather than when the model loads."""
    problems: list[str] = []
    for name, versions in value.items():
        if not isinstance(versions, Mapping):
            kind = type(versions).__name__
            problems.append(f"model {name!r} must be an object of versions, got {kind}")
            continue
        for version, entry in versions.items():
            where = f"model {name!r} version {version!r}"
            if not isinstance(entry, Mapping):
                kind = type(entry).__name__
                problems.append(f"{where} must be an object of settings, got {kind}")
                continue
            convert_layer(entry, MODELS_BLOCK_KEYS, where, problems, {})
            convert_layer(entry, TRAFFIC_KEYS, where, problems, {})
    if problems:
        raise Problems(problems)
    return value
