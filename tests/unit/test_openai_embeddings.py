"""OpenAI's embeddings in the worker: vectors shortened and renormalised, packed as base64,
and a handler that answers no vector refused when those need one."""

import base64
import json
import struct

import pytest

from mservd.worker.codecs.openai_embeddings import EmbeddingRefused, Embeddings, encode


class Vector(list):
    prompt_tokens = 3


def test_vectors_are_shortened_renormalised_and_packed_little_endian() -> None:
    doc = json.loads(encode(Embeddings("e", "base64", 2), [Vector([3.0, 4.0, 12.0]),
                                                           Vector([0.0, 2.0, 1.0])]))
    packed = [struct.unpack("<2f", base64.b64decode(d["embedding"])) for d in doc["data"]]
    assert packed[0] == pytest.approx((0.6, 0.8)) and packed[1] == pytest.approx((0.0, 1.0))
    assert doc["usage"] == {"prompt_tokens": 6, "total_tokens": 6}


def test_dimensions_past_the_vector_or_a_handler_that_does_not_embed_are_refused() -> None:
    with pytest.raises(EmbeddingRefused, match="this model's embeddings have 3"):
        encode(Embeddings("e", "float", 4), [[1.0, 2.0, 3.0]])
    with pytest.raises(EmbeddingRefused, match="'echo' answered dict"):
        encode(Embeddings("echo", "float", 1), [{"body": "x"}])
    assert json.loads(encode(Embeddings("echo"), [{"body": "x"}]))["data"][0]["embedding"] \
        == {"body": "x"}  # asked for nothing that needs a vector: as the handler answered
