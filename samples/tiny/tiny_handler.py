"""Handler for the ``tiny`` MLP: a JSON list of 64 numbers in, a list of 10 floats out.

Written against TorchServe's ``BaseHandler`` using only its standard hooks, so the same ``.mar``
runs on TorchServe and on mservd. The base class loads ``tiny_model.py`` + the state dict and
runs ``inference``; this file only turns requests into one batch tensor and back. It is the
overhead-bound benchmark model, so a batch costs one tensor build, one forward and one
``tolist``.

A request that is not 64 numbers fails alone: mservd gets a ``RequestError`` at its position,
TorchServe gets status 400 for that request with the same message.
"""

from __future__ import annotations

import json
from typing import Any

import torch

try:  # mservd: also where ``ts.*`` resolves inside a worker
    from handlers import BaseHandler, RequestError
except ImportError:  # real TorchServe
    from ts.torch_handler.base_handler import BaseHandler

    RequestError = None

WIDTH = 64
FLOAT32_MAX = 3.4028234663852886e38  # a larger number would be inf in the batch tensor


class TinyHandler(BaseHandler):
    def preprocess(self, data: list[dict[str, Any]]) -> torch.Tensor:
        rows: list[list[float]] = []
        # Per batch: the position of each request's row in the tensor, or its error message.
        self._slots: list[int | str] = []
        for request in data:
            value = request.get("body")
            if value is None:
                value = request.get("data")
            problem = None
            if isinstance(value, (bytes, bytearray)):
                try:
                    value = json.loads(value)
                except ValueError as exc:  # UnicodeDecodeError too
                    problem = f"a body that is not JSON ({exc})"
                except RecursionError:  # "[[[[..." deeper than the parser goes
                    problem = "JSON nested too deeply to parse"
            problem = problem or _shape_problem(value)
            if problem is None:
                self._slots.append(len(rows))
                rows.append(value)
            else:
                self._slots.append(f"expected a JSON list of {WIDTH} numbers, got {problem}")
        if not rows:
            return torch.empty((0, WIDTH))
        return torch.tensor(rows, dtype=torch.float32)

    def postprocess(self, data: torch.Tensor) -> list[Any]:
        outputs = data.tolist()
        results: list[Any] = []
        for idx, slot in enumerate(self._slots):
            if isinstance(slot, int):
                results.append(outputs[slot])
            elif RequestError is not None:
                results.append(RequestError(400, slot))
            else:
                self.context.set_response_status(400, slot, idx=idx)
                results.append({"code": 400, "type": "BadInput", "message": slot})
        return results


def _shape_problem(value: Any) -> str | None:
    """None when ``value`` is a list of 64 numbers, else a short description of what it is."""
    if not isinstance(value, list):
        text = repr(value)
        return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"
    if len(value) != WIDTH:
        return f"a list of {len(value)} items"
    for item in value:
        # bool is an int subclass, but true/false in a feature vector is a client bug
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            return f"a list containing {type(item).__name__} {item!r}"
        # JSON's NaN, Infinity and 1e400 (inf) parse, and an int past float's range would
        # raise in torch.tensor, failing every request of the batch (False for NaN too)
        if not abs(item) <= FLOAT32_MAX:
            text = repr(item)
            return (f"a list containing {text[:20] + '...' if len(text) > 20 else text}, not a "
                    "finite 32-bit float")
    return None
