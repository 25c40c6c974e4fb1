"""The server's settings resolved: defaults → ``config.properties`` → ``TS_<KEY>`` environment
variables (only when ``enable_envvars_config`` is on) → command-line overrides, every problem
collected before one :class:`ConfigError` is raised."""

from __future__ import annotations

import dataclasses
import logging
import os
import types
from collections.abc import Mapping
from typing import Any

from mservd.config.convert import (
    ConfigError,
    Convert,
    Problems,
    to_bool,
    to_json_object,
)
from mservd.config.model_keys import valid_models_block
from mservd.config.properties import read_properties, with_variables
from mservd.config.settings import Settings, keyed_fields

logger = logging.getLogger(__name__)


# config.properties keys TorchServe acts on that mservd does not, and what happens instead:
# each is named in a warning at start, so an operator does not believe it applied
TORCHSERVE_PROPERTIES_NOT_APPLIED = {
    "number_of_netty_threads": "TorchServe's Netty thread count: the HTTP frontends are "
                               "frontend_workers gunicorn workers, each one event loop",
    "netty_client_threads": "TorchServe's Netty thread count: the HTTP frontends are "
                            "frontend_workers gunicorn workers, each one event loop",
    "service_envelope": "requests are read by the route they come in on (KServe v1 and v2, "
                        "OpenAI) and the handler sees TorchServe's rows",
    "workflow_store": "workflows are not served",
    "default_service_handler": "an archive names its handler",
    "unregister_model_timeout": "an unregister answers at once; the version's workers "
                                "finish their batches and stop after it",
    "async_logging": "logs are written by each process as they come",
}


def load(
    config_file: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Resolve the server settings: defaults → config.properties → ``TS_<KEY>`` → overrides.

    Environment variables apply only when ``enable_envvars_config`` is true; the variable
    ``TS_ENABLE_ENVVARS_CONFIG``, when set, decides over the file (it is the higher layer).

    :param config_file: the config.properties to read; ``None`` reads none. A file named here
        that does not exist is an error.
    :param env: the environment to read ``TS_<KEY>`` from; ``os.environ`` when ``None``.
    :param overrides: values from command-line flags, by field name (``snapshot``) or key
        (``enable_snapshot``), typed or as strings; ``None`` values are skipped.
    :raises ConfigError: listing every bad value at once.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    keyed = keyed_fields()
    by_key = {f.metadata["key"]: (f, convert) for f, convert in keyed}
    by_name = {f.name: (f, convert) for f, convert in keyed}
    values: dict[str, Any] = {}
    problems: list[str] = []

    def apply(f: dataclasses.Field[Any], convert: Convert, raw: Any, source: str,
              secret: bool = False) -> None:
        try:
            values[f.name] = convert(raw)
        except ValueError as exc:
            where = f.metadata["key"] + (f" (from {source})" if source else "")
            lines = exc.problems if isinstance(exc, Problems) else [str(exc)]
            if secret:  # the message would show it
                lines = ["the value is not valid for this key"]
            problems.extend(f"{where}: {line}" for line in lines)

    path: str | None = None
    extra: dict[str, str] = {}
    if config_file is not None:
        path = os.fspath(config_file)
        for key, written in read_properties(path, problems).items():
            raw = with_variables(key, written, environ, problems)
            if raw is None:  # a variable it names is not set: reported
                continue
            if key in by_key:
                # a value from the environment may be a secret: a problem does not show it
                secret = raw != written
                apply(*by_key[key], raw, f"{written}, not shown" if secret else "", secret)
            else:
                extra[key] = raw
        for key in sorted(extra.keys() & TORCHSERVE_PROPERTIES_NOT_APPLIED.keys()):
            logger.warning("%s in %s is not applied by mservd: %s", key, path,
                           TORCHSERVE_PROPERTIES_NOT_APPLIED[key])
        if extra:
            logger.debug("Keys in %s that mservd does not use: %s", path, ", ".join(sorted(extra)))

    envvars_on = bool(values.get("enable_envvars_config", False))
    switch = environ.get("TS_ENABLE_ENVVARS_CONFIG")
    if switch is not None:
        try:
            envvars_on = to_bool(switch)
        except ValueError:
            pass  # reported below, with the other TS_ variables
    if envvars_on or switch is not None:
        for f, convert in keyed:
            var = "TS_" + f.metadata["key"].upper()
            if var in environ and (envvars_on or f.name == "enable_envvars_config"):
                apply(f, convert, environ[var], var)

    for name, raw in (overrides or {}).items():
        if raw is None:
            continue
        target = by_name.get(name) or by_key.get(name)
        if target is None:
            problems.append(f"{name}: not a setting (from command line)")
            continue
        apply(*target, raw, "command line")

    if "model_snapshot" in extra and "models" not in values:
        # KServe's TorchServe configs list their models in a TorchServe snapshot document
        try:
            models = to_json_object(extra["model_snapshot"]).get("models")
            if not isinstance(models, Mapping):
                raise ValueError(f"its models must be an object, got {type(models).__name__}")
            values["models"] = valid_models_block(dict(models))
        except ValueError as exc:
            lines = exc.problems if isinstance(exc, Problems) else [str(exc)]
            problems.extend(f"model_snapshot: {line}" for line in lines)

    if problems:
        raise ConfigError(problems)
    return Settings(**values, extra=types.MappingProxyType(extra), config_file=path)
