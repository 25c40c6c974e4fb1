"""One model version's settings: defaults → the ``models=`` block of ``config.properties`` → the
archive's ``model-config.yaml`` → the management API call, resolved into one frozen
:class:`ModelSettings`."""

from __future__ import annotations

import logging
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mservd.config.convert import ConfigError, Convert, above, at_least, chain, to_bool, to_int
from mservd.errors import short_repr

if typing.TYPE_CHECKING:
    from mservd.config.settings import Settings

logger = logging.getLogger(__name__)


# --- per-model settings -----------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSettings:
    """One model version's resolved settings. Build it with :func:`resolve_model_settings`."""

    min_workers: int
    max_workers: int
    batch_size: int
    max_batch_delay: int  # milliseconds
    response_timeout: int  # seconds
    startup_timeout: int  # seconds
    job_queue_size: int
    device_type: str | None  # "cpu", "gpu", or None: the daemon decides
    device_ids: tuple[int, ...]
    default_version: bool
    # model-config.yaml continuousBatching: a worker runs up to batch_size requests at once,
    # each joining and leaving between decoding steps (handlers/causal_lm.py)
    continuous_batching: bool = False
    # model-config.yaml batchSize: auto: the scheduler sizes batches and their delay from the
    # batching advisor's fit (mservd/core/advisor.py), starting at batch_size
    auto_batch: bool = False
    # model-config.yaml maxLatencyMs: the latency target the advisor sizes batches for
    max_latency_ms: int | None = None
    # model-config.yaml sequenceBatching (TorchServe's stateful inference, mservd/core/sequences.py):
    # each sequence's requests run in order on one worker, one at a time (with
    # continuous_batching: each joins between steps, the next while the one before streams);
    # at most max_num_sequence sequences open (at least batch_size x max_workers, as in
    # TorchServe), each queueing max_sequence_job_queue_size requests, closed after
    # sequence_max_idle_ms without a request (0, the default: not applied, as in TorchServe)
    # or sequence_timeout_ms after it opened (0: never)
    sequence_batching: bool = False
    max_num_sequence: int = 1
    max_sequence_job_queue_size: int = 1
    sequence_max_idle_ms: int = 0
    sequence_timeout_ms: int = 0

    @property
    def latency_target(self) -> float | None:
        """``max_latency_ms`` in seconds (None: no target)."""
        return self.max_latency_ms / 1000.0 if self.max_latency_ms else None


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
AUTO_BATCH_START = 8  # the batch size batchSize: auto starts from, before the advisor's fit


def _batch_size(value: Any) -> int | str:
    """A batch size, or ``auto``: sized by the batching advisor."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return _BATCH(value)


# camelCase key of model-config.yaml and the models= block → (ModelSettings field, converter)
_MODEL_YAML_KEYS: Mapping[str, tuple[str, Convert]] = types.MappingProxyType(
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
    {**_MODEL_YAML_KEYS, "defaultVersion": ("default_version", to_bool)}
)
# the management API's query names (register and scale-workers calls)
_API_KEYS: Mapping[str, tuple[str, Convert]] = types.MappingProxyType(
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


def resolve_model_settings(
    settings: Settings,
    model_name: str,
    version: str,
    *,
    model_yaml: Mapping[str, Any] | None = None,
    api: Mapping[str, Any] | None = None,
    gpu_count: int = 0,
) -> ModelSettings:
    """One model version's settings: API call > model-config.yaml > ``models=`` block > defaults.

    :param model_yaml: the archive's model-config.yaml (:func:`read_model_yaml`); keys other
        than the worker settings are left to the handler.
    :param api: the management call's query parameters, strings or typed; other parameters
        (``url``, ``synchronous``) are ignored. ``initial_workers`` is the register call's name
        for ``min_worker``; as in TorchServe, a call that sets the minimum but no
        ``max_worker`` sets the maximum to the same number.
    :param gpu_count: the GPUs the daemon will use (after ``number_of_gpu``); with
        ``default_workers_per_model=0`` a model gets that many workers, at least 1.
    :raises ConfigError: listing every bad value, each named by source and key.
    """
    workers = settings.default_workers_per_model or max(1, gpu_count)
    values: dict[str, Any] = {
        "min_workers": workers,
        "max_workers": workers,
        "batch_size": settings.batch_size,
        "max_batch_delay": settings.max_batch_delay,
        "response_timeout": settings.default_response_timeout,
        "startup_timeout": settings.default_startup_timeout,
        "job_queue_size": settings.job_queue_size,
        "device_type": None,
        "device_ids": (),
        "default_version": False,
        "continuous_batching": False,
        "auto_batch": False,
        "max_latency_ms": None,
        "sequence_batching": False,
        "max_num_sequence": 1,
        "max_sequence_job_queue_size": 1,
        "sequence_max_idle_ms": 0,
        "sequence_timeout_ms": 0,
    }
    origin: dict[str, str] = {}
    problems: list[str] = []

    versions = settings.models.get(model_name)
    entry = versions.get(version) if isinstance(versions, Mapping) else None
    if isinstance(entry, Mapping):
        where = f"config.properties models[{model_name!r}][{version!r}]"
        values.update(convert_layer(entry, MODELS_BLOCK_KEYS, where, problems, origin))
    if model_yaml:
        yaml_values = convert_layer(
            model_yaml, _MODEL_YAML_KEYS, "model-config.yaml", problems, origin
        )
        values.update(yaml_values)
        for key in sorted(TORCHSERVE_KEYS_NOT_APPLIED.keys() & model_yaml.keys()):
            logger.warning("model %s version %s: model-config.yaml's %s is TorchServe's and "
                           "not applied by mservd (%s)", model_name, version, key,
                           TORCHSERVE_KEYS_NOT_APPLIED[key])
    if api:
        given = {k: v for k, v in api.items() if v is not None}
        if "min_worker" in given:
            given.pop("initial_workers", None)  # the explicit name wins
        api_values = convert_layer(given, _API_KEYS, "API", problems, origin)
        if "min_workers" in api_values and "max_worker" not in given:
            api_values["max_workers"] = api_values["min_workers"]
            origin["max_workers"] = origin["min_workers"]
        values.update(api_values)

    if not problems and values["max_workers"] < values["min_workers"]:
        # A bound nobody set follows the one that was set; two set bounds that cross are an error.
        if "max_workers" not in origin:
            values["max_workers"] = values["min_workers"]
        elif "min_workers" not in origin:
            values["min_workers"] = values["max_workers"]
        else:
            problems.append(
                f"max_worker ({values['max_workers']}) must be >= "
                f"min_worker ({values['min_workers']}) "
                f"(max from {origin['max_workers']}, min from {origin['min_workers']})"
            )
    cap = settings.max_workers_per_model
    for key in ("min_workers", "max_workers"):
        if not problems and values[key] > cap:
            problems.append(f"{key.replace('workers', 'worker')} ({values[key]}) is more than "
                            f"max_workers_per_model ({cap}) (from {origin.get(key, 'defaults')})")
    if problems:
        raise ConfigError(
            problems, title=f"Invalid settings for model {model_name!r} version {version!r}"
        )
    if values["batch_size"] == "auto":
        values["batch_size"], values["auto_batch"] = AUTO_BATCH_START, True
    if values["sequence_batching"] and values["sequence_max_idle_ms"] <= 0:
        # as in TorchServe, whose sequences exist only with an idle time: 0, its default, is
        # "not a stateful model" (a sequence closed once idle would move between workers)
        logger.warning("model %s version %s: sequenceBatching is not applied without "
                       "sequenceMaxIdleMSec (0: not a stateful model, as in TorchServe)",
                       model_name, version)
        values["sequence_batching"] = False
    if values["sequence_batching"]:  # as TorchServe counts it: at least a batch of sequences
        values["max_num_sequence"] = max(  # for every worker the model may run
            values["max_num_sequence"], values["batch_size"] * values["max_workers"])
    return ModelSettings(**values)
