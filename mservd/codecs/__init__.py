"""One decoder/encoder pair per protocol, used by the worker (and ``mservd run-handler``).

A request's codec (``protocol.Request.codec``, set by the frontend that took it) turns its
payloads into the rows of the handler's batch and the handler's outputs for those rows into
one answer, in the protocol's own shape, errors included::

    call = codec.decode(request, context)          # rows, and what encoding needs
    head, body = codec.encode(call, outputs, context, limit)
    head, body = codec.error(status, type, message)

A TorchServe or v2 request is one row; a KServe V1 request is one row per instance.
"""

from __future__ import annotations

from mservd import protocol
from mservd.codecs import kserve_v1, torchserve, v2
from mservd.codecs.base import Call, Codec

CODECS: dict[str, Codec] = {
    protocol.CODEC_TORCHSERVE: torchserve.CODEC,
    protocol.CODEC_KSERVE_V1: kserve_v1.CODEC,
    protocol.CODEC_V2: v2.CODEC,
}

__all__ = ["CODECS", "Call", "Codec"]
