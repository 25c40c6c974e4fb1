"""OpenAI's embeddings (``/v1/embeddings``) in the worker: rows from the checked request, and
the answer from the handler's vectors.

The frontend checked the body (``mservd/openai_request.py``); here each input text becomes a
row of the handler's batch (``handlers/text_embedder.py``), at most the KServe V1 cap of them,
and the answer is OpenAI's list: each vector shortened to ``dimensions`` and renormalised (L2),
as Matryoshka-trained models allow, and sent as JSON floats or, with ``encoding_format:
"base64"``, as base64 of little-endian float32 (what the ``openai`` client asks for by default
and decodes). ``usage.prompt_tokens`` is the tokens the handler ran, when it says (a vector
with a ``prompt_tokens`` attribute, as ``text_embedder``'s are). The OpenAI codec
(``openai.py``) calls in here for its embedding requests.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

from mservd.openai_request import OpenAIError, OpenAIRequest, wrong_kind
from mservd.worker.codecs.base import Call
from mservd.worker.codecs.kserve_v1 import MIN_INSTANCES_CAP


class EmbeddingRefused(ValueError):
    """Vectors that cannot be answered as asked (``dimensions`` above the model's size)."""


@dataclass
class Embeddings:
    """What one embeddings request needs until its answer is whole."""

    model: str
    encoding_format: str = "float"
    dimensions: int | None = None
    kind: str = field(default="embedding", init=False)  # what the OpenAI codec branches on


def decode(checked: OpenAIRequest, context: Any) -> Call:
    """One row per input text, for a model that embeds.

    :raises OpenAIError: the model is not an embedding model, or the request carries more
        texts than a batch.
    """
    refused = refusal(checked.kind, checked.model, context)
    if refused:
        raise OpenAIError(refused)
    check_rows(len(checked.texts), '"input" has {} texts', context)
    options = checked.options
    state = Embeddings(checked.model, options.get("encoding_format", "float"),
                       options.get("dimensions"))
    return Call([{"body": text} for text in checked.texts], state=state)


def check_rows(count: int, what: str, context: Any) -> None:
    """Refuse a request of more rows (texts, documents: ``what`` says, with ``{}`` for the
    count) than a batch takes: the model's batch size, or the KServe V1 cap if larger.

    :raises OpenAIError: too many.
    """
    cap = max(context.system_properties.get("batch_size") or 1, MIN_INSTANCES_CAP)
    if count > cap:  # each is a row of the handler's batch
        raise OpenAIError(f"{what.format(count)}; a request may carry at most {cap} (the "
                          f"model's batch size, or {MIN_INSTANCES_CAP} if that is smaller). "
                          "Split it into several requests.")


def refusal(endpoint: str, model: str, context: Any) -> str | None:
    """Why this worker's model cannot serve ``endpoint`` (see ``openai_request.wrong_kind``),
    from its manifest's handler and its model-config.yaml; None when it can."""
    handler = ((getattr(context, "manifest", None) or {}).get("model") or {}).get("handler")
    return wrong_kind(endpoint, model, str(handler or ""),
                      getattr(context, "model_yaml_config", None) or {})


def encode(state: Embeddings, outputs: list[Any]) -> bytes:
    """OpenAI's list of embeddings, in input order.

    :raises EmbeddingRefused: ``dimensions`` is above a vector's length.
    """
    data = []
    tokens = 0
    for index, output in enumerate(outputs):
        tokens += int(getattr(output, "prompt_tokens", 0) or 0)
        vector = output
        if isinstance(vector, dict):  # a handler answering {"embedding": [...]}
            vector = vector.get("embedding", vector)
        if hasattr(vector, "tolist"):
            vector = vector.tolist()
        if state.dimensions is not None or state.encoding_format == "base64":
            vector = numbers(vector, state.model)
        if state.dimensions is not None:
            vector = shortened(vector, state.dimensions)
        embedding: Any = vector
        if state.encoding_format == "base64":
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return json.dumps({"object": "list", "data": data, "model": state.model,
                       "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).encode()


def numbers(vector: Any, model: str) -> list[float]:
    """A handler's vector as floats, to shorten or pack.

    :raises EmbeddingRefused: it is no list of numbers (a handler of the user's own that does
        not embed).
    """
    if isinstance(vector, list) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in vector):
        return vector
    raise EmbeddingRefused(f"Model {model!r} answered {type(vector).__name__}, not a vector "
                           'of numbers: "dimensions" and "encoding_format": "base64" need an '
                           "embedding model.")


def shortened(vector: list[float], dimensions: int) -> list[float]:
    """The first ``dimensions`` numbers of ``vector``, scaled back to unit L2 length.

    :raises EmbeddingRefused: the vector is shorter than ``dimensions``.
    """
    if dimensions > len(vector):
        raise EmbeddingRefused(f'"dimensions" is {dimensions}; this model\'s embeddings have '
                               f"{len(vector)}: send at most {len(vector)}.")
    head = [float(x) for x in vector[:dimensions]]
    norm = math.sqrt(sum(x * x for x in head))
    return [x / norm for x in head] if norm > 0 else head
