"""The v2 codec: JSON tensors, the binary extension, every datatype, and clear errors."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from mservd.v2.codec import (
    DATATYPES,
    NUMPY_TYPES,
    Tensor,
    V2Error,
    decode_request,
    decode_response,
    encode_response,
    from_bytes,
    to_bytes,
)
from mservd.v2.metadata import ModelMetadata, from_model_yaml
from mservd.worker.codecs.v2_tensors import decode_row, encode_answer


def _binary_request(tensors: list[Tensor]) -> tuple[bytes, int]:
    blobs = [to_bytes(t) for t in tensors]
    header = json.dumps({"inputs": [
        {"name": t.name, "datatype": t.datatype, "shape": t.shape,
         "parameters": {"binary_data_size": len(b)}} for t, b in zip(tensors, blobs)]}).encode()
    return header + b"".join(blobs), len(header)


@pytest.mark.parametrize("datatype", sorted(NUMPY_TYPES))
def test_v2_codec_round_trips_every_numeric_datatype_binary_and_json(datatype) -> None:
    dtype = NUMPY_TYPES[datatype]
    data = (np.arange(6) % 2 == 0) if datatype == "BOOL" else np.arange(6).astype(dtype)
    tensor = Tensor("x", datatype, [2, 3], data.reshape(2, 3))
    body, length = _binary_request([tensor])
    got = decode_request(body, length).inputs[0]
    assert got.data.dtype == dtype and got.shape == [2, 3]
    np.testing.assert_array_equal(got.data, tensor.data)
    doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": [2, 3],
                       "data": data.reshape(2, 3).tolist()}]}
    np.testing.assert_array_equal(decode_request(json.dumps(doc).encode()).inputs[0].data,
                                  tensor.data)


def test_v2_codec_bytes_are_length_prefixed_little_endian() -> None:
    data = np.array([b"ab", b"", "é".encode()], dtype=object)
    raw = to_bytes(Tensor("s", "BYTES", [3], data))
    assert raw == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0) + struct.pack("<I", 2) \
        + "é".encode()
    assert from_bytes(raw, "BYTES", [3]).tolist() == [b"ab", b"", "é".encode()]


def test_v2_codec_bf16_and_fp16() -> None:
    values = np.array([1.0, -2.5, 3.140625], dtype=np.float32)
    raw = to_bytes(Tensor("b", "BF16", [3], values))
    assert len(raw) == 6
    np.testing.assert_array_equal(from_bytes(raw, "BF16", [3]), values)
    half = to_bytes(Tensor("h", "FP16", [3], values.astype(np.float16)))
    np.testing.assert_array_equal(from_bytes(half, "FP16", [3]), values.astype(np.float16))


def test_v2_response_binary_and_json_outputs_decode_back() -> None:
    outs = [Tensor("a", "FP32", [1, 2], np.array([[1.5, 2.0]], dtype=np.float32)),
            Tensor("b", "BYTES", [1], np.array([b"hi"], dtype=object))]
    body, length = encode_response("m", "1.0", "id-1", outs, [True, False])
    doc, tensors = decode_response(body, length)
    assert doc["id"] == "id-1" and doc["outputs"][1]["data"] == ["hi"]
    assert tensors[0].data.tolist() == [[1.5, 2.0]] and tensors[1].data.tolist() == [b"hi"]


@pytest.mark.parametrize("body,length,message", [
    (b"{not json", None, "not valid JSON"),
    (b'{"inputs": []}', None, "no 'inputs'"),
    (b'{"inputs": [{"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}]}', None,
     "datatype 'FP8'"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}]}', None,
     "has 1 elements but shape [2]"),
    (b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": ["a"]}]}', None,
     "holds 'a'"),
    ((b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], '
      b'"parameters": {"binary_data_size": 4}}]}\x00\x00'), None, "not valid JSON"),
    (b'{}', 10, "Inference-Header-Content-Length is 10"),
    ((b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], '
      b'"parameters": {"binary_data_size": true}}]}\x07'), 104, "binary_data_size True"),
])
def test_v2_codec_rejects_malformed_requests_clearly(body, length, message) -> None:
    with pytest.raises(V2Error, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_request(body, length)


def test_v2_row_for_a_plain_handler_and_its_plain_answer() -> None:
    values = np.arange(64, dtype=np.float32).reshape(1, 64)
    body, length = _binary_request([Tensor("INPUT0", "FP32", [1, 64], values)])
    row, call = decode_row(f"application/vnd.mservd.v2; header-length={length}", body,
                           ModelMetadata())
    assert row["body"] == values[0].tolist() and row["INPUT0"] == row["body"]
    answer, content_type, headers = encode_answer(call, [0.5] * 10, ModelMetadata(), "tiny", "1")
    assert content_type == "application/json" and not headers
    out = json.loads(answer)["outputs"][0]
    assert out == {"name": "output0", "datatype": "FP32", "shape": [1, 10], "data": [0.5] * 10}


def test_v2_metadata_from_model_yaml_and_its_errors() -> None:
    meta = from_model_yaml({"v2": {"inputs": [{"name": "x", "datatype": "fp32",
                                               "shape": [-1, 3]}]}})
    assert meta.inputs[0].datatype == "FP32" and meta.inputs[0].accepts_shape([7, 3])
    assert not meta.inputs[0].accepts_shape([7, 4])
    assert from_model_yaml({}).inputs == []
    with pytest.raises(V2Error, match="datatype 'F32'"):
        from_model_yaml({"v2": {"outputs": [{"name": "y", "datatype": "F32"}]}})
    assert set(DATATYPES) >= {"BOOL", "BF16", "BYTES", "UINT64"}


def test_v2_metadata_errors_print_a_huge_entry_shortened() -> None:
    """A v2 entry that is a huge structure (YAML aliases) is named in a bounded message."""
    huge = ["x"] * 9
    for _ in range(8):
        huge = [huge] * 9
    for entry in ({"name": "y", "datatype": huge}, {"name": "y", "datatype": "FP32",
                                                     "shape": huge}, {"name": huge}):
        with pytest.raises(V2Error) as info:
            from_model_yaml({"v2": {"outputs": [entry]}})
        assert "model-config.yaml v2.outputs entry" in str(info.value)
        assert len(str(info.value)) < 600
    with pytest.raises(V2Error, match=r"v2.platform \[\[\["):
        from_model_yaml({"v2": {"platform": huge}})


def test_an_input_the_model_does_not_take_is_refused_before_its_data_are_decoded() -> None:
    """3.2 M BYTES elements sent for an FP32 input were all decoded (3 s of the worker) before
    the datatype was found wrong."""
    from mservd.v2 import metadata
    from mservd.worker.codecs import v2_tensors

    meta = metadata.from_model_yaml({"v2": {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 64]}]}})
    doc = {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 64],
                       "data": ["not", "even", "64"]}]}  # data that would not decode
    with pytest.raises(V2Error, match="has datatype BYTES, the model expects FP32"):
        v2_tensors.decode_row("", json.dumps(doc).encode(), meta)
    doc["inputs"][0].update(datatype="FP32", shape=[1, 3])
    with pytest.raises(V2Error, match=r"has shape \[1, 3\], the model expects \[1, 64\]\.$"):
        v2_tensors.decode_row("", json.dumps(doc).encode(), meta)
