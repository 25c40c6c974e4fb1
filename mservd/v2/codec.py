"""The Open Inference Protocol v2 infer body: JSON tensors and the binary tensor extension.

Pure and numpy-based: bytes in, tensors out, and back. It runs in the backend worker (the
controller never decodes payloads) and in the gRPC frontend's tests; it knows nothing of
handlers, sockets or HTTP.

A binary request is a JSON header of ``header_length`` bytes followed by each binary input's
raw little-endian bytes, in input order, ``parameters.binary_data_size`` bytes each. BYTES
tensors are a run of elements, each a 4-byte little-endian length then that many bytes. BF16
has no numpy type: it is carried as float32 arrays and converted at the wire.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# datatype -> numpy dtype on the wire (little-endian); BF16 and BYTES are handled apart
NUMPY_TYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
DATATYPES = (*NUMPY_TYPES, "BF16", "BYTES")


class V2Error(ValueError):
    """A v2 body that cannot be decoded or a result that cannot be encoded: a 400 to the client."""


class UnknownOutput(V2Error):
    """An output the request asks for that the model's answer lacks: the request's fault (400),
    found only once the model has answered."""


@dataclass
class Tensor:
    """One named tensor. ``data`` is a numpy array of ``shape``: float32 for BF16, object
    (``bytes`` elements) for BYTES, the matching dtype otherwise."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None  # None: follow the request's binary_data_output


@dataclass
class InferRequest:
    id: str | None
    parameters: dict[str, Any]
    inputs: list[Tensor]
    outputs: list[RequestedOutput] | None  # None: every output the model produces

    @property
    def binary_output(self) -> bool:
        return bool(self.parameters.get("binary_data_output", False))


# -- decoding ------------------------------------------------------------------------------

def decode_request(body: bytes, header_length: int | None = None,
                   check: Callable[[str, str, list[int]], None] | None = None) -> InferRequest:
    """Parse an infer request body; ``header_length`` is Inference-Header-Content-Length.
    ``check`` (name, datatype, shape) may refuse an input before its data are decoded: a
    tensor the model does not take costs no conversion of its elements."""
    if header_length is None:
        header_length = len(body)
    if header_length < 0 or header_length > len(body):
        raise V2Error(f"Inference-Header-Content-Length is {header_length} but the body has "
                      f"{len(body)} bytes; send the JSON header's length in bytes.")
    try:
        doc = json.loads(bytes(body[:header_length]))
    except (UnicodeDecodeError, ValueError) as exc:
        raise V2Error(f"The inference request header is not valid JSON ({exc}); check "
                      "Inference-Header-Content-Length when sending binary tensors.") from None
    if not isinstance(doc, dict):
        raise V2Error("The inference request must be a JSON object with an 'inputs' list.")
    raw = memoryview(body)[header_length:]
    inputs_doc = doc.get("inputs")
    if not isinstance(inputs_doc, list) or not inputs_doc:
        raise V2Error("The inference request has no 'inputs': send a list of "
                      "{name, shape, datatype, data} objects.")
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise V2Error("'parameters' must be a JSON object.")
    inputs = []
    offset = 0
    for item in inputs_doc:
        tensor, used = _decode_input(item, raw, offset, check)
        offset += used
        inputs.append(tensor)
    if offset != len(raw):
        raise V2Error(f"The body has {len(raw) - offset} bytes after the last binary input; "
                      "binary_data_size of the inputs must add up to the binary part.")
    outputs = None
    if doc.get("outputs") is not None:
        if not isinstance(doc["outputs"], list):
            raise V2Error("'outputs' must be a list of {name, parameters} objects.")
        outputs = []
        for out in doc["outputs"]:
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise V2Error(f"Requested output {out!r} has no name.")
            params = out.get("parameters") or {}
            binary = params.get("binary_data") if isinstance(params, dict) else None
            outputs.append(RequestedOutput(out["name"], None if binary is None else bool(binary)))
    rid = doc.get("id")
    return InferRequest(None if rid is None else str(rid), parameters, inputs, outputs)


def _decode_input(item: Any, raw: memoryview, offset: int,
                  check: Callable[[str, str, list[int]], None] | None) -> tuple[Tensor, int]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise V2Error(f"Input {item!r} is not an object with a name.")
    name = item["name"]
    datatype = item.get("datatype")
    if datatype not in DATATYPES:
        raise V2Error(f"Input {name!r} has datatype {datatype!r}; use one of "
                      f"{', '.join(DATATYPES)}.")
    shape = item.get("shape")
    if (not isinstance(shape, list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise V2Error(f"Input {name!r} has shape {shape!r}; a shape is a list of "
                      "non-negative integers.")
    if check is not None:
        check(name, datatype, shape)
    params = item.get("parameters") or {}
    count = math.prod(shape)
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is not None:
        if (not isinstance(size, int) or isinstance(size, bool) or size < 0
                or offset + size > len(raw)):
            raise V2Error(f"Input {name!r} announces binary_data_size {size!r} but only "
                          f"{len(raw) - offset} bytes of binary data remain.")
        data = from_bytes(bytes(raw[offset:offset + size]), datatype, shape, name)
        used = size
    elif "data" in item:
        data = from_json(item["data"], datatype, shape, name)
        used = 0
    else:
        raise V2Error(f"Input {name!r} has neither 'data' nor "
                      "parameters.binary_data_size.")
    if data.size != count:
        raise V2Error(f"Input {name!r} has {data.size} elements but shape {shape} needs "
                      f"{count}.")
    return Tensor(name, datatype, list(shape), data.reshape(shape)), used


def from_bytes(raw: bytes, datatype: str, shape: list[int], name: str = "tensor") -> np.ndarray:
    """The array of one tensor's raw little-endian bytes (the binary extension, gRPC raw)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        items = []
        pos = 0
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise V2Error(f"BYTES input {name!r} ends inside an element's 4-byte length.")
            (length,) = struct.unpack_from("<I", raw, pos)
            pos += 4
            if pos + length > len(raw):
                raise V2Error(f"BYTES input {name!r} has an element of {length} bytes but "
                              f"only {len(raw) - pos} remain.")
            items.append(raw[pos:pos + length])
            pos += length
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out
    if datatype == "BF16":
        if len(raw) != 2 * count:
            raise V2Error(f"Input {name!r} (BF16, shape {shape}) needs {2 * count} bytes, "
                          f"got {len(raw)}.")
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32)
    dtype = NUMPY_TYPES[datatype]
    if len(raw) != dtype.itemsize * count:
        raise V2Error(f"Input {name!r} ({datatype}, shape {shape}) needs "
                      f"{dtype.itemsize * count} bytes, got {len(raw)}.")
    return np.frombuffer(raw, dtype=dtype).copy()


def from_json(data: Any, datatype: str, shape: list[int], name: str = "tensor") -> np.ndarray:
    """The array of a JSON ``data`` value, flat or nested, in row-major order."""
    flat = _flatten(data)
    if datatype == "BYTES":
        out = np.empty(len(flat), dtype=object)
        try:
            out[:] = [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in flat]
        except TypeError:
            raise V2Error(f"BYTES input {name!r} must hold strings.") from None
        return out
    if datatype == "BOOL":
        if not all(isinstance(x, bool) for x in flat):
            raise V2Error(f"BOOL input {name!r} must hold true/false values.")
        return np.array(flat, dtype=np.bool_)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in flat):
        bad = next(x for x in flat if not isinstance(x, (int, float)) or isinstance(x, bool))
        raise V2Error(f"Input {name!r} is {datatype} but holds {bad!r}; send numbers.")
    try:
        if datatype == "BF16":
            return np.array(flat, dtype=np.float32)
        dtype = NUMPY_TYPES[datatype]
        if dtype.kind in "iu":
            if not all(isinstance(x, int) or float(x).is_integer() for x in flat):
                raise V2Error(f"Input {name!r} is {datatype} but holds fractional numbers.")
            info = np.iinfo(dtype)
            if flat and (min(flat) < info.min or max(flat) > info.max):
                raise V2Error(f"Input {name!r} holds values outside the {datatype} range.")
        return np.array(flat, dtype=dtype)
    except OverflowError:
        raise V2Error(f"Input {name!r} holds values outside the {datatype} range.") from None


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


# -- encoding ------------------------------------------------------------------------------

def to_bytes(tensor: Tensor) -> bytes:
    """One tensor's raw little-endian bytes (BYTES length-prefixed, BF16 rounded to nearest)."""
    data = tensor.data
    if tensor.datatype == "BYTES":
        parts = []
        for item in data.reshape(-1):
            value = _as_bytes(item)
            parts.append(struct.pack("<I", len(value)))
            parts.append(value)
        return b"".join(parts)
    if tensor.datatype == "BF16":
        bits = np.ascontiguousarray(data, dtype=np.float32).reshape(-1).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype("<u2").tobytes()
    return np.ascontiguousarray(data, dtype=NUMPY_TYPES[tensor.datatype]).tobytes()


def to_json_data(tensor: Tensor) -> list[Any]:
    """The flat JSON ``data`` list of one tensor."""
    flat = tensor.data.reshape(-1)
    if tensor.datatype == "BYTES":
        out = []
        for item in flat:
            try:
                out.append(_as_bytes(item).decode("utf-8"))
            except UnicodeDecodeError:
                raise V2Error(f"Output {tensor.name!r} holds bytes that are not UTF-8; ask for "
                              "it with binary_data=true.") from None
        return out
    if tensor.datatype == "BF16":
        return np.asarray(flat, dtype=np.float32).tolist()
    return np.asarray(flat, dtype=NUMPY_TYPES[tensor.datatype]).tolist()


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, np.generic):
        item = item.item()
    if isinstance(item, (bytes, str)):
        return _as_bytes(item)
    return json.dumps(item).encode("utf-8")


def encode_response(model_name: str, model_version: str, request_id: str | None,
                    outputs: list[Tensor], binary: list[bool],
                    parameters: dict[str, Any] | None = None) -> tuple[bytes, int | None]:
    """The infer response body and, when any output is binary, its JSON header's length."""
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = parameters
    entries = []
    blobs = []
    for tensor, as_binary in zip(outputs, binary):
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype,
                                 "shape": list(tensor.shape)}
        if as_binary:
            blob = to_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = to_json_data(tensor)
        entries.append(entry)
    doc["outputs"] = entries
    header = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def decode_response(body: bytes, header_length: int | None = None) -> tuple[dict[str, Any],
                                                                             list[Tensor]]:
    """The JSON header and the output tensors of an infer response (used by the gRPC frontend)."""
    if header_length is None:
        header_length = len(body)
    doc = json.loads(bytes(body[:header_length]))
    raw = memoryview(body)[header_length:]
    tensors = []
    offset = 0
    for item in doc.get("outputs") or []:
        params = item.get("parameters") or {}
        size = params.get("binary_data_size")
        if size is not None:
            data = from_bytes(bytes(raw[offset:offset + size]), item["datatype"], item["shape"],
                              item["name"])
            offset += size
        else:
            data = from_json(item.get("data", []), item["datatype"], item["shape"], item["name"])
        tensors.append(Tensor(item["name"], item["datatype"], list(item["shape"]),
                              data.reshape(item["shape"])))
    return doc, tensors


# -- how a frontend forwards a v2 infer body to the worker, undecoded -------------------------

CONTENT_TYPE = "application/vnd.mservd.v2"
HEADER_LENGTH = "Inference-Header-Content-Length"


def content_type(header_length: int | None) -> str:
    """The input content type a frontend forwards a v2 infer body with."""
    if header_length is None:
        return CONTENT_TYPE
    return f"{CONTENT_TYPE}; header-length={int(header_length)}"


def parse_content_type(value: str | None) -> tuple[bool, int | None]:
    """(is this a v2 body, the JSON header's length or None for an all-JSON body)."""
    if not value or not value.startswith(CONTENT_TYPE):
        return False, None
    length = None
    for part in value.split(";")[1:]:
        key, _, raw = part.strip().partition("=")
        if key == "header-length":
            try:
                length = int(raw)
            except ValueError:
                raise V2Error(f"Inference-Header-Content-Length {raw!r} is not an integer.") \
                    from None
    return True, length
