"""One model version's settings: defaults → the ``models=`` block of ``config.properties`` → the
archive's ``model-config.yaml`` → the management API call, resolved into one frozen
:class:`ModelSettings`."""

from __future__ import annotations

import logging
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mservd.config.convert import ConfigError
from mservd.config.model_keys import (
    API_KEYS,
    MODEL_YAML_KEYS,
    MODELS_BLOCK_KEYS,
    TORCHSERVE_KEYS_NOT_APPLIED,
    convert_layer,
)

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


AUTO_BATCH_START = 8  # the batch size batchSize: auto starts from, before the advisor's fit


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
            model_yaml, MODEL_YAML_KEYS, "model-config.yaml", problems, origin
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
        api_values = convert_layer(given, API_KEYS, "API", problems, origin)
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
