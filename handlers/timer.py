"""``timed``: TorchServe's decorator that times a handler method (``ts.handler_utils.timer``).

With ``handler: {profile: true}`` in the model's model-config.yaml, each call of a decorated
method records a ``ts_handler_<method>`` time in milliseconds through ``context.metrics``;
otherwise the method runs untimed. On a GPU the device is synchronised before each reading, so
the time is the kernels' as well as the Python's.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch


def _profiling(handler: Any) -> bool:
    context = getattr(handler, "context", None)
    config = getattr(context, "model_yaml_config", None) or {}
    section = config.get("handler")
    return isinstance(section, dict) and bool(section.get("profile"))


def _synchronise(handler: Any) -> None:
    device = getattr(handler, "device", None)
    if isinstance(device, torch.device) and device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(method: Callable) -> Callable:
    """Time ``method`` when the model's config asks for profiling (see the module)."""

    @functools.wraps(method)
    def timed_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _profiling(self):
            return method(self, *args, **kwargs)
        _synchronise(self)
        start = time.perf_counter()
        result = method(self, *args, **kwargs)
        _synchronise(self)
        self.context.metrics.add_time(f"ts_handler_{method.__name__}",
                                      (time.perf_counter() - start) * 1000)
        return result

    return timed_method
