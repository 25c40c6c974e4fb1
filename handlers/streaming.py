"""Sending intermediate responses from a handler, with TorchServe's function signature.

This module owns only the handler-side call. The worker owns the transport: it sets
``context.stream_callback`` to a function that takes ``(idx, item)`` and sends one chunk.
"""

from __future__ import annotations

import logging
from typing import Any

from handlers.context import Context

logger = logging.getLogger(__name__)


def send_intermediate_predict_response(
    ret: list[Any], req_id_map: dict[int, str], message: str, code: int, context: Context
) -> bool:
    """Send ``ret[i]`` as an intermediate response to request ``i`` of the current batch.

    Compatible with TorchServe's ``ts.handler_utils.utils.send_intermediate_predict_response``:
    ``ret`` holds one item per request, and ``req_id_map`` maps positions to request ids.
    Each request's status stays what the handler set (``context.set_response_status``; 200
    by default): as in TorchServe, ``code`` and ``message`` describe the message, not its
    requests. Returns ``True`` as TorchServe does.
    """
    for idx, item in enumerate(ret):
        if idx not in req_id_map:
            raise ValueError(
                f"Intermediate response {idx} has no request id in req_id_map {req_id_map!r}; "
                "pass context.request_ids."
            )
        context.send_intermediate(idx, item)
    return True
