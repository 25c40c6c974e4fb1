"""Class indices to label names: reading ``index_to_name.json`` and applying it.

This module owns the label file's formats (TorchServe's): ``{"0": "cat", ...}``, values that are
lists (the last element is the name, as in ImageNet's ``["n01440764", "tench"]``), and the older
``{"object_type_names": [...]}``. Without a mapping, a class's label is its index as a string.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

MAPPING_FILE = "index_to_name.json"


def load_label_mapping(path: str) -> dict[str, str] | None:
    """The index → name mapping in ``path``, or ``None`` when the file does not exist."""
    if not os.path.isfile(path):
        logger.debug("%s is missing; outputs will use class indices as labels", path)
        return None
    with open(path, encoding="utf-8") as f:
        try:
            mapping: Any = json.load(f)
        except ValueError as exc:
            raise ValueError(f"Label file {path!r} is not valid JSON: {exc}") from None
    if not isinstance(mapping, dict):
        raise TypeError(
            f"Label file {path!r} holds a {type(mapping).__name__}; it must be a JSON object "
            'like {"0": "cat", "1": "dog"}.'
        )
    names = mapping.get("object_type_names")
    if isinstance(names, list):
        return {str(i): str(name) for i, name in enumerate(names)}
    result: dict[str, str] = {}
    for key, value in mapping.items():
        if isinstance(value, list) and value:
            value = value[-1]
        if not isinstance(value, str):
            raise TypeError(
                f"Label file {path!r} maps {key!r} to {value!r}; each label must be a string "
                "or a list whose last element is a string."
            )
        result[str(key)] = value
    return result


def label_for(index: int | str, mapping: dict[str, str] | None) -> str:
    """The label of class ``index``; its index as a string when the mapping lacks it."""
    if mapping is None:
        return str(index)
    return mapping.get(str(index), str(index))


def map_class_to_label(
    probs: Sequence[Sequence[Any]],
    mapping: dict[str, str] | None = None,
    lbl_classes: Sequence[Sequence[Any]] | None = None,
) -> list[dict[str, Any]]:
    """One ``{label: value}`` dict per row; ``lbl_classes`` gives each row's class indices (all
    classes in order when omitted), as TorchServe's function of this name. Values are kept as
    given: TorchServe's object detector maps boxes, not probabilities."""
    rows = []
    for r, row in enumerate(probs):
        indices = lbl_classes[r] if lbl_classes is not None else range(len(row))
        rows.append({label_for(c if isinstance(c, str) else int(c), mapping): p
                     for c, p in zip(indices, row)})
    return rows
