"""Making TorchServe's import paths (``ts.context``, ``ts.torch_handler.base_handler``,
``ts.utils.util``, ...) resolve to mservd's modules, so handlers written for TorchServe load
unchanged.

This module owns the alias table and the finder that serves it. The backend worker calls
:func:`install_ts_aliases` once before loading a handler; from then on ``import ts.X`` gives
mservd's module for ``X``. Aliases resolve when first imported, not all at install: the vision
modules import torchvision (and through it ``torch._dynamo``, seconds of start-up), which a
worker whose handler never asks for them must not pay for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

from handlers.loader import BUILTIN_HANDLERS

logger = logging.getLogger(__name__)

# TorchServe module → mservd module whose public names it exposes; each built-in handler
# (handlers.loader.BUILTIN_HANDLERS) is also ts.torch_handler.<its name>.
TS_ALIASES = {
    "ts.context": "handlers.context",
    "ts.utils.util": "handlers.ts_util",
    "ts.torch_handler.base_handler": "handlers.base_handler",
    "ts.torch_handler.vision_handler": "handlers.vision_handler",
    "ts.torch_handler.text_handler": "handlers.text_handler",
    **{f"ts.torch_handler.{name}": target.partition(":")[0]
       for name, target in BUILTIN_HANDLERS.items()},
    "ts.handler_utils.utils": "handlers.streaming",
    "ts.handler_utils.timer": "handlers.timer",
    "ts.protocol.otf_message_handler": "handlers.streaming",
    "ts.metrics.metric_type_enum": "handlers.metrics",
    "ts.metrics.dimension": "handlers.metrics",
    "ts.torch_handler.unit_tests.test_utils.mock_context": "handlers.mock_context",
}




def _packages() -> set[str]:
    """``ts``, ``ts.torch_handler``, ...: every parent of an alias, an empty package."""
    found: set[str] = set()
    for name in TS_ALIASES:
        parts = name.split(".")[:-1]
        found.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return found


class TorchServeAliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``ts.*`` modules in the alias table and hands back mservd's module for each."""

    def __init__(self) -> None:
        self.packages = _packages()

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        if fullname in TS_ALIASES:
            return importlib.util.spec_from_loader(fullname, self)
        if fullname in self.packages:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        ours = TS_ALIASES.get(spec.name)
        if ours is None:
            return None  # a package: the default empty module
        module = importlib.import_module(ours)
        spec.loader_state = module.__spec__  # the import system overwrites it; put it back
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None and spec.loader_state is not None:
            module.__spec__ = spec.loader_state


def install_ts_aliases() -> None:
    """Let ``ts.*`` imports resolve to mservd's modules (ahead of a real TorchServe's)."""
    if any(isinstance(finder, TorchServeAliasFinder) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, TorchServeAliasFinder())
    logger.debug("TorchServe import aliases installed")
