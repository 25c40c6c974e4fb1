"""What a handler uses to speak the Open Inference Protocol v2 as well as /predictions.

A handler written for /predictions answers v2 unchanged: for a v2 request its row holds each
input by name and, when there is exactly one input, also as ``"body"``, in the form a JSON
/predictions request gives (a leading batch dimension of 1 removed; numbers as nested lists,
BYTES elements as ``bytearray``). Its plain return value becomes one output.

A v2-aware handler reads the typed tensors and returns named outputs::

    from handlers.v2 import V2Outputs, v2_inputs

    def handle(self, data, context):
        out = []
        for idx, row in enumerate(data):
            tensors = v2_inputs(context, idx)      # {name: numpy array}, or None for /predictions
            x = tensors["INPUT0"] if tensors is not None else np.asarray(row["body"])
            out.append(V2Outputs(OUTPUT0=x * 2))   # named outputs, datatype from the array
        return out

See docs/v2.md for datatypes, shapes and metadata.
"""

from __future__ import annotations

from typing import Any


class V2Outputs(dict):
    """Named outputs of one request: ``{name: array, tensor, list, str or bytes}``.

    For a /predictions request the worker sends it as a JSON object of lists.
    """


def v2_inputs(context: Any, idx: int, as_torch: bool = False) -> dict[str, Any] | None:
    """Request ``idx``'s v2 inputs as ``{name: numpy array}`` (torch tensors with
    ``as_torch``), shaped and typed as sent; ``None`` when the request is not a v2 request.

    BYTES tensors are numpy object arrays of ``bytes`` (never torch); BF16 arrives as float32
    (as torch.bfloat16 with ``as_torch``).
    """
    calls = getattr(context, "v2_requests", None) or []
    call = calls[idx] if idx < len(calls) else None
    if call is None:
        return None
    out = {}
    for tensor in call.request.inputs:
        value = tensor.data
        if as_torch and tensor.datatype != "BYTES":
            import torch

            value = torch.from_numpy(value)
            if tensor.datatype == "BF16":
                value = value.to(torch.bfloat16)
        out[tensor.name] = value
    return out


def is_v2_request(context: Any, idx: int) -> bool:
    """Whether request ``idx`` of the current batch came over the v2 protocol."""
    calls = getattr(context, "v2_requests", None) or []
    return idx < len(calls) and calls[idx] is not None
