"""mservd's handler side: the ``Context``, the errors, ``BaseHandler``, the built-ins and the
loader that resolves a manifest's ``handler`` value.

Everything here runs inside a backend worker. ``BaseHandler`` and ``load_handler`` import torch,
so they load on first use: importing ``handlers.context`` or ``handlers.errors`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from handlers.context import Context
from handlers.errors import BadInputError, PredictionException, RequestError

if TYPE_CHECKING:
    from handlers.base_handler import BaseHandler
    from handlers.loader import load_handler

__all__ = [
    "BadInputError",
    "BaseHandler",
    "Context",
    "PredictionException",
    "RequestError",
    "load_handler",
]

_LAZY = {"BaseHandler": "handlers.base_handler", "load_handler": "handlers.loader"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'handlers' has no attribute {name!r}")
