"""An ``.onnx`` serialized file as ``BaseHandler``'s model: an onnxruntime session.

TorchServe's ``BaseHandler`` makes ``self.model`` an ``onnxruntime.InferenceSession`` for a
``.onnx`` file, and its users' handlers call ``self.model.run(...)`` in ``inference``; so does
mservd's, so those handlers serve unchanged. The session runs where the worker does: on the
worker's own GPU (``cuda:<gpu_id>``, CUDA's provider when onnxruntime-gpu has it) or on the
CPU with the worker's share of the cores as its threads. A handler that keeps
``BaseHandler.inference`` gets the batch run as the session's first input and its first output
back as a tensor.
"""

from __future__ import annotations

import os
from typing import Any

import torch

ONNX_SUFFIX = ".onnx"


def onnx_session(path: str, device: torch.device) -> Any:
    """An onnxruntime session for ``path`` on ``device``."""
    if not os.path.isfile(path):
        raise RuntimeError(f"Serialized file {path!r} does not exist.")
    try:
        import onnxruntime as ort
    except ImportError:
        raise RuntimeError(
            f"{path} is an ONNX model, and onnxruntime is not installed where the workers run: "
            "pip install onnxruntime (onnxruntime-gpu for CUDA)."
        ) from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # the worker's share of the cores
    providers: list[Any] = ["CPUExecutionProvider"]
    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
    return ort.InferenceSession(path, sess_options=options, providers=providers)


def run_session(session: Any, data: Any) -> torch.Tensor:
    """The batch ``data`` (a tensor or an array) as the session's first input; its first
    output, as a tensor."""
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().numpy()
    first = session.get_inputs()[0].name
    return torch.from_numpy(session.run(None, {first: data})[0])
