"""The worker's side of v2: a v2 request into a handler row, a handler's output into a v2 reply.

A frontend (REST ``/v2/.../infer`` or the gRPC ``ModelInfer``) forwards the infer body untouched
as one input of content type ``application/vnd.mservd.v2`` (the JSON header's length as a
``header-length`` parameter when tensors follow it in binary). The worker, not the controller,
decodes it here, so a v2 request batches with any other request of its model.

The handler contract is in handlers/v2.py and docs/v2.md. Errors here are per request: a bad
body is a 400 ``{"error": ...}`` for that request alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from mservd.v2.codec import (
    HEADER_LENGTH,
    NUMPY_TYPES,
    InferRequest,
    Tensor,
    UnknownOutput,
    V2Error,
    decode_request,
    encode_response,
    parse_content_type,
)
from mservd.v2.metadata import ModelMetadata
from mservd.worker.payload import json_default

log = logging.getLogger(__name__)
DEFAULT_OUTPUT = "output0"

@dataclass
class V2Call:
    """One v2 request of a batch, kept by the worker until its answer is encoded."""

    request: InferRequest
    squeezed: bool  # the row's plain values dropped a leading batch dimension of 1


def decode_row(content_type_value: str, payload: bytes,
               meta: ModelMetadata) -> tuple[dict[str, Any], V2Call]:
    """The handler row of a v2 request and the call to answer it with.

    :raises V2Error: the body is malformed or does not match the model's declared inputs.
    """
    try:
        return _decode_row(content_type_value, payload, meta)
    except V2Error:
        raise
    except Exception as exc:  # a codec bug must fail this request, never the worker
        log.exception("v2 request could not be decoded")
        raise V2Error(f"The v2 request could not be decoded: {type(exc).__name__}: {exc}") \
            from None


def _decode_row(content_type_value: str, payload: bytes,
                meta: ModelMetadata) -> tuple[dict[str, Any], V2Call]:
    _, header_length = parse_content_type(content_type_value)
    request = decode_request(payload, header_length, lambda name, datatype, shape:
                             _check_declared(meta, name, datatype, shape))
    _check_inputs(request, meta)
    squeezed = all(len(t.shape) >= 1 and t.shape[0] == 1 for t in request.inputs)
    row: dict[str, Any] = {}
    for tensor in request.inputs:
        row[tensor.name] = _plain(tensor, squeezed)
    if len(request.inputs) == 1:
        row["body"] = row[request.inputs[0].name]
    return row, V2Call(request, squeezed)


def _check_declared(meta: ModelMetadata, name: str, datatype: str, shape: list[int]) -> None:
    """Refuse an input the model does not declare as it is (its name, datatype, shape)."""
    if not meta.inputs:
        return
    spec = next((s for s in meta.inputs if s.name == name), None)
    if spec is None:
        raise V2Error(f"Model has no input {name!r}; its inputs are "
                      f"{', '.join(sorted(s.name for s in meta.inputs))}.")
    if datatype != spec.datatype:
        raise V2Error(f"Input {name!r} has datatype {datatype}, the model expects "
                      f"{spec.datatype}.")
    if not spec.accepts_shape(shape):
        raise V2Error(f"Input {name!r} has shape {shape}, the model expects "
                      f"{spec.shape}{' (-1: any size)' if -1 in spec.shape else ''}.")


def _check_inputs(request: InferRequest, meta: ModelMetadata) -> None:
    """Every declared input is there (each one sent was checked as it was decoded)."""
    if not meta.inputs:
        return
    declared = {spec.name for spec in meta.inputs}
    missing = declared - {t.name for t in request.inputs}
    if missing:
        raise V2Error(f"Inputs {', '.join(sorted(missing))} are missing from the request.")


def _plain(tensor: Tensor, squeezed: bool) -> Any:
    """A tensor as a JSON /predictions request would have given it to the handler."""
    data = tensor.data[0] if squeezed else tensor.data
    if tensor.datatype == "BYTES":
        if not isinstance(data, np.ndarray):  # one element of an object array
            return bytearray(data)
        if data.ndim == 0:
            return bytearray(data.item())
        return _nested_bytes(data)
    return data.tolist()


def _nested_bytes(data: np.ndarray) -> list[Any]:
    if data.ndim == 1:
        return [bytearray(x) for x in data]
    return [_nested_bytes(x) for x in data]


# -- answers -------------------------------------------------------------------------------

def error_answer(message: str) -> bytes:
    """The body of a v2 error: ``{"error": message}``."""
    return json.dumps({"error": message}).encode("utf-8")


def encode_answer(call: V2Call, item: Any, meta: ModelMetadata, model_name: str,
                  model_version: str) -> tuple[bytes, str, dict[str, str]]:
    """Body, content type and headers of a v2 infer response for one handler output.

    :raises V2Error: the output cannot be made into tensors or a requested output is missing.
    """
    from handlers.v2 import V2Outputs

    if isinstance(item, V2Outputs) or (
            isinstance(item, dict) and meta.outputs
            and set(item) <= {spec.name for spec in meta.outputs}):
        tensors = [_to_tensor(str(name), value, meta, False) for name, value in item.items()]
    else:
        name = meta.outputs[0].name if meta.outputs else DEFAULT_OUTPUT
        tensors = [_to_tensor(name, item, meta, call.squeezed)]
    request = call.request
    if request.outputs is not None:
        by_name = {t.name: t for t in tensors}
        chosen = []
        binary = []
        for wanted in request.outputs:
            tensor = by_name.get(wanted.name)
            if tensor is None:
                raise UnknownOutput(f"Requested output {wanted.name!r} is not produced by the "
                                    "model; "
                              f"it produces {', '.join(sorted(by_name))}.")
            chosen.append(tensor)
            binary.append(request.binary_output if wanted.binary is None else wanted.binary)
        tensors = chosen
    else:
        binary = [request.binary_output] * len(tensors)
    body, header_length = encode_response(model_name, model_version, request.id, tensors, binary)
    if header_length is None:
        return body, "application/json", {}
    return body, "application/octet-stream", {HEADER_LENGTH: str(header_length)}


def _to_tensor(name: str, value: Any, meta: ModelMetadata, add_batch_dim: bool) -> Tensor:
    """A handler value as a tensor: datatype from the metadata, else from the value."""
    spec = meta.output(name)
    datatype, array = _as_array(value, name)
    if spec is not None and spec.datatype != datatype:
        datatype, array = _cast(array, spec.datatype, name)
    if add_batch_dim:
        array = array.reshape((1, *array.shape))
    return Tensor(name, datatype, list(array.shape), array)


def _as_array(value: Any, name: str) -> tuple[str, np.ndarray]:
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        import torch

        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            return "BF16", tensor.float().numpy()
        value = tensor.numpy()
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return "BYTES", _bytes_array([value])[0:1].reshape(())
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        return _datatype_of(array, name), array if array.dtype.kind != "U" else \
            _bytes_array(array.reshape(-1).tolist()).reshape(array.shape)
    if isinstance(value, (list, tuple, bool, int, float)):
        try:
            numbers: np.ndarray | None = np.asarray(value)
        except ValueError:
            numbers = None  # ragged
        if numbers is not None and numbers.dtype.kind in "biuf":
            array = numbers
            if array.dtype.kind == "f":
                array = array.astype(np.float32)  # Python floats: PyTorch's default dtype
            elif array.dtype.kind in "iu":
                array = array.astype(np.int64)
            return _datatype_of(array, name), array
        if numbers is not None and numbers.dtype.kind in "US":
            return "BYTES", _bytes_array(numbers.reshape(-1).tolist()).reshape(numbers.shape)
    # anything else (a dict, a ragged list): one BYTES element holding its JSON
    text = json.dumps(value, default=json_default).encode("utf-8")
    return "BYTES", _bytes_array([text]).reshape(())


def _bytes_array(items: list[Any]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in items]
    return out


def _datatype_of(array: np.ndarray, name: str) -> str:
    if array.dtype == object:
        return "BYTES"
    if array.dtype.kind in "US":
        return "BYTES"
    for datatype, dtype in NUMPY_TYPES.items():
        if array.dtype == dtype or (array.dtype.kind == dtype.kind
                                    and array.dtype.itemsize == dtype.itemsize):
            return datatype
    raise V2Error(f"Output {name!r} has numpy dtype {array.dtype}, which has no v2 datatype.")


def _cast(array: np.ndarray, datatype: str, name: str) -> tuple[str, np.ndarray]:
    if datatype == "BYTES":
        return "BYTES", _bytes_array([x if isinstance(x, (bytes, str)) else str(x)
                                      for x in array.reshape(-1).tolist()]).reshape(array.shape)
    if datatype == "BF16":
        return "BF16", array.astype(np.float32)
    try:
        return datatype, array.astype(NUMPY_TYPES[datatype])
    except (TypeError, ValueError):
        raise V2Error(f"Output {name!r} cannot be cast to its declared datatype "
                      f"{datatype}.") from None
