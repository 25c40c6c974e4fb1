"""What TorchServe's ``ts.utils.util`` offers handlers, under its names, from mservd's modules.

Only the names handlers use: ``PredictionException``, ``get_yaml_config``,
``list_classes_from_module``, ``load_label_mapping``, ``map_class_to_label``. Reached as
``ts.utils.util`` through :mod:`handlers.ts_compat`.
"""

from __future__ import annotations

from typing import Any

import yaml

from handlers.errors import PredictionException
from handlers.labels import load_label_mapping, map_class_to_label
from handlers.user_code import classes_defined_in as list_classes_from_module

__all__ = [
    "PredictionException",
    "get_yaml_config",
    "list_classes_from_module",
    "load_label_mapping",
    "map_class_to_label",
]


def get_yaml_config(yaml_file_path: str) -> Any:
    """A YAML file's contents (handlers read their own configs with it)."""
    with open(yaml_file_path, encoding="utf-8") as stream:
        return yaml.safe_load(stream)
