"""One decoder/encoder pair per protocol, used by the worker (and ``mservd run-handler``).

A request's codec (``protocol.Request.codec``, set by the frontend that took it) turns its
payloads into the rows of the handler's batch and the handler's outputs for those rows into
one answer, in the protocol's own shape, errors included::

    call = codec.decode(request, context)          # rows, and what encoding needs
    head, body = encode_answer(codec, call, outputs, context, limit)  # or a RequestError
    head, body = codec.error(status, type, message)

A TorchServe, v2 or OpenAI generation request is one row; a KServe V1 request is one row per
instance, an OpenAI embeddings request one per input, a rerank request one per document. A
streamed part is encoded by ``codec.encode_part`` (None: nothing to send now).
"""

from __future__ import annotations

import logging
from typing import Any

from mservd import protocol
from mservd.v2.codec import V2Error
from mservd.worker.codecs import generate, kserve_v1, openai, rerank, torchserve, v2
from mservd.worker.codecs.base import Call, Codec, encode_answer
from mservd.worker.payload import InputError

log = logging.getLogger("mservd.worker")

CODECS: dict[str, Codec] = {
    protocol.CODEC_TORCHSERVE: torchserve.CODEC,
    protocol.CODEC_KSERVE_V1: kserve_v1.CODEC,
    protocol.CODEC_V2: v2.CODEC,
    protocol.CODEC_OPENAI: openai.CODEC,
    protocol.CODEC_GENERATE: generate.CODEC,
    protocol.CODEC_RERANK: rerank.CODEC,
}
#: the errors a codec raises for bytes it cannot read: their message is the answer's
READ_ERRORS = (InputError, kserve_v1.V1Error, V2Error, openai.OpenAIError,
               generate.GenerateError)

Decoded = tuple[protocol.Request, Codec, Call]


def decode(requests: list[protocol.Request],
           context: Any) -> tuple[list[Decoded], list[protocol.Result]]:
    """Each request decoded by its codec, and the 400 answers of those that cannot be: a
    request's bytes fail that request alone, whatever they raise."""
    decoded, refused = [], []
    for request in requests:
        codec = CODECS[request.codec]
        try:
            decoded.append((request, codec, codec.decode(request, context)))
        except Exception as exc:
            refused.append(protocol.Result(request.rid, *undecodable(codec, request, exc)))
    return decoded, refused


def undecodable(codec: Codec, request: protocol.Request, exc: Exception) -> tuple[bytes, bytes]:
    """The 400 answer to a request whose inputs cannot be decoded, in its protocol's shape:
    the decoders' own errors say what is wrong; anything else is named with its type."""
    if isinstance(exc, READ_ERRORS):
        message = str(exc)
    else:
        message = f"The request's input cannot be decoded: {type(exc).__name__}: {exc}"
    log.warning("request %s refused: %s", request.rid.decode(errors="replace"), message)
    return codec.error(400, "BadRequestException", message)


__all__ = ["CODECS", "Call", "Codec", "decode", "encode_answer"]
