"""The YAML files an archive carries (``model-config.yaml``, a metrics file), read with
bounds: a few hundred bytes of aliases must not become gigabytes in every worker."""

from __future__ import annotations

import logging
import os
from typing import Any

import yaml

from mservd.config.convert import ConfigError
from mservd.errors import short_repr

logger = logging.getLogger(__name__)


def read_model_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An archive's model-config.yaml as a dict (empty file → ``{}``).

    :raises ConfigError: the file cannot be read, is not YAML, is not a mapping, or is past
        ``MODEL_YAML_MAX_BYTES`` or ``MODEL_YAML_MAX_VALUES``.
    """
    name = os.fspath(path)
    title = "Invalid model-config.yaml"
    try:
        with open(name, encoding="utf-8") as stream:
            text = stream.read(MODEL_YAML_MAX_BYTES + 1)
        if len(text.encode()) > MODEL_YAML_MAX_BYTES:
            raise ConfigError([f"{name!r} is larger than {MODEL_YAML_MAX_BYTES} bytes"],
                              title=title)
        data = yaml.load(text, Loader=_SAFE_LOADER)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{name!r} cannot be read: {exc}"], title=title) from None
    except (yaml.YAMLError, RecursionError) as exc:  # nested past Python's stack too
        raise ConfigError([f"{name!r} is not valid YAML: {str(exc)[:300]}"],
                          title=title) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        problem = f"{name!r} must be a mapping of keys to values, got {kind}"
        raise ConfigError([problem], title=title)
    if _expands_past(data, MODEL_YAML_MAX_VALUES):
        problem = (f"{name!r} holds more than {MODEL_YAML_MAX_VALUES} values once its YAML "
                   "aliases are expanded")
        raise ConfigError([problem], title=title)
    return data


# A model-config.yaml travels to every worker as JSON, aliases expanded: a "billion laughs" of
# a few hundred bytes would be gigabytes there, so a file past this many values is refused.
MODEL_YAML_MAX_VALUES = 100_000
# TorchServe's are a few hundred bytes; a larger one is a handler's data, which belongs in the
# archive's extra files. Parsing takes about 0.25 s per MiB with libyaml, 2 s without.
MODEL_YAML_MAX_BYTES = 1 << 20
# libyaml's safe loader where PyYAML was built with it: the same documents, ten times faster
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _expands_past(data: Any, limit: int) -> bool:
    """Whether ``data`` has more than ``limit`` values, counting a shared value (a YAML alias)
    once per place it appears; stops counting at the limit."""
    pending, seen = [data], 0
    while pending:
        value = pending.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
    return False


METRIC_TYPES = ("counter", "gauge", "histogram")


def read_model_metrics(path: str) -> list[dict[str, Any]]:
    """The ``model_metrics`` of a TorchServe metrics.yaml, one ``{name, unit, dimensions,
    type}`` per metric (its ``ts_metrics``, the frontend's, are TorchServe's own and unused).

    :raises ValueError: the file cannot be read, or the section is not TorchServe's shape.
    """
    try:
        with open(path, encoding="utf-8") as stream:
            data = yaml.safe_load(stream) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"{path!r} cannot be read as YAML: {str(exc)[:300]}") from None
    section = data.get("model_metrics") if isinstance(data, dict) else None
    if section is None:
        return []
    if not isinstance(section, dict):
        raise ValueError(f"{path!r}: model_metrics must map counter, gauge or histogram to "
                         "lists of metrics")
    declared = []
    for kind, metrics in section.items():
        if kind not in METRIC_TYPES or not isinstance(metrics, list):
            raise ValueError(f"{path!r}: model_metrics.{str(kind)[:60]} must be one of "
                             f"{', '.join(METRIC_TYPES)}, with a list of metrics")
        for metric in metrics:
            # names only, checked before anything is printed: YAML's aliases make a small
            # file a huge structure once written out
            names = (metric.get("dimensions") or []) if isinstance(metric, dict) else None
            if (not isinstance(metric, dict) or not isinstance(metric.get("name"), str)
                    or not isinstance(metric.get("unit", ""), str)
                    or not isinstance(names, list)
                    or not all(isinstance(n, str) for n in names)):
                raise ValueError(f"{path!r}: model_metrics.{kind} has {short_repr(metric)}; "
                                 "each metric is {name, unit, dimensions: [names]}, strings")
            declared.append({"name": metric["name"], "unit": metric.get("unit", ""),
                             "dimensions": list(names), "type": kind})
    return declared
