"""KServe's V1 protocol in the worker: ``{"instances": [...]}`` in, ``{"predictions": [...]}`` out.

As in TorchServe's KServe envelope, each instance becomes one row of the handler's batch, so
a handler written for ``/predictions`` answers V1 unchanged; the instances' answers are joined
back into one ``predictions`` list per request. The frontend forwards the body untouched;
decoding happens here, in the worker. Errors are ``{"error": ...}``; an instance's own error
answers its whole request.
"""

from __future__ import annotations

import json
from typing import Any

from mservd import protocol
from mservd.worker.codecs.base import Call, WholeParts, too_large


class V1Error(ValueError):
    """A V1 body that cannot be read; the request alone is answered 400."""


MIN_INSTANCES_CAP = 64  # instances one request may carry: this many, or the batch size


def decode_rows(payload: bytes, batch_size: int = 1) -> list[dict[str, Any]]:
    """One handler row per instance: ``{"body": instance, "data": instance}``.

    A request carries at most ``max(batch_size, MIN_INSTANCES_CAP)`` instances: each is a row
    of the handler's batch, so one request must not make a batch of thousands."""
    try:
        doc = json.loads(payload)
    except RecursionError:
        raise V1Error("The JSON body is nested too deeply to parse.") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise V1Error(f"The body is not JSON: {exc}") from None
    instances = doc.get("instances", doc.get("inputs")) if isinstance(doc, dict) else None
    if not isinstance(instances, list) or not instances:
        raise V1Error('The body must be {"instances": [...]} with at least one instance.')
    cap = max(batch_size, MIN_INSTANCES_CAP)
    if len(instances) > cap:
        raise V1Error(f"The body has {len(instances)} instances; a request may carry at most "
                      f"{cap} (the model's batch size, or {MIN_INSTANCES_CAP} if that is "
                      "smaller). Split it into several requests.")
    return [{"body": instance, "data": instance} for instance in instances]


class KServeV1Codec(WholeParts):
    def decode(self, request: protocol.Request, context: Any) -> Call:
        if len(request.payloads) != 1:
            raise V1Error("A KServe V1 request is one JSON body.")
        batch_size = context.system_properties.get("batch_size") or 1
        return Call(decode_rows(request.payloads[0], batch_size))

    def encode(self, call: Call, outputs: list[Any], context: Any,
               limit: int) -> tuple[bytes, bytes]:
        try:
            body = encode_predictions(outputs)
        except Exception as exc:  # TypeError, ValueError, RecursionError, a tolist() that raises
            return self.error(500, "InternalServerException",
                              f"The predictions cannot be encoded: {exc}")
        if len(body) > limit:
            return self.error(500, "InternalServerException", too_large(len(body), limit))
        return protocol.head(200), body

    def error(self, status: int, type_: str, message: str) -> tuple[bytes, bytes]:
        return protocol.head(status), json.dumps({"error": message}).encode()


def encode_predictions(items: list[Any]) -> bytes:
    from mservd.worker.payload import encode_output

    predictions = []
    for item in items:
        if isinstance(item, (bytes, bytearray)):
            item = bytes(item).decode("utf-8", "replace")
        elif not isinstance(item, str):
            item = json.loads(encode_output(item)[0])
        predictions.append(item)
    return json.dumps({"predictions": predictions}).encode()


CODEC = KServeV1Codec()
