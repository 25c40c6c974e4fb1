"""Making TorchServe's import paths (``ts.context``, ``ts.torch_handler.base_handler``,
``ts.utils.util``, ...) resolve to mservd's modules, so handlers written for TorchServe load
unchanged.

This module owns the alias table and nothing else. The backend worker calls
:func:`install_ts_aliases` once before loading a handler; it registers modules in
``sys.modules`` and does no other import-system magic.
"""

from __future__ import annotations

import importlib
import logging
import sys
from types import ModuleType

logger = logging.getLogger(__name__)

# TorchServe module → mservd module whose public names it exposes.
TS_ALIASES = {
    "ts.context": "handlers.context",
    "ts.utils.util": "handlers.ts_util",
    "ts.torch_handler.base_handler": "handlers.base_handler",
    "ts.torch_handler.vision_handler": "handlers.vision_handler",
    "ts.torch_handler.image_classifier": "handlers.image_classifier",
    "ts.torch_handler.image_segmenter": "handlers.image_segmenter",
    "ts.torch_handler.object_detector": "handlers.object_detector",
    "ts.torch_handler.text_handler": "handlers.text_handler",
    "ts.torch_handler.text_classifier": "handlers.text_classifier",
    "ts.handler_utils.utils": "handlers.streaming",
    "ts.protocol.otf_message_handler": "handlers.streaming",
    "ts.metrics.metric_type_enum": "handlers.metrics",
    "ts.metrics.dimension": "handlers.metrics",
}


def install_ts_aliases() -> None:
    """Register the ``ts.*`` aliases; a no-op for names already imported (a real TorchServe)."""
    for ts_name, ours in TS_ALIASES.items():
        if ts_name in sys.modules:
            continue
        module = importlib.import_module(ours)
        sys.modules[ts_name] = module
        parent_name, _, child = ts_name.rpartition(".")
        parent = _package(parent_name)
        setattr(parent, child, module)
    logger.debug("TorchServe import aliases installed")


def _package(name: str) -> ModuleType:
    """An empty package ``name`` (and its parents) in ``sys.modules``."""
    existing = sys.modules.get(name)
    if existing is not None:
        return existing
    package = ModuleType(name, f"mservd alias package for TorchServe's {name}")
    package.__path__ = []
    sys.modules[name] = package
    parent_name, _, child = name.rpartition(".")
    if parent_name:
        setattr(_package(parent_name), child, package)
    return package
