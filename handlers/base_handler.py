"""``BaseHandler``: the TorchServe-compatible handler that loads a model and runs
``preprocess → inference → postprocess`` on a batch.

This module owns choosing the device, loading the model (TorchScript, an eager ``modelFile``
plus a state dict, AOTInductor's ``.so``, or ONNX through ``onnx_session.py``), reading
``index_to_name.json``, and the whole-batch ``handle``. It does not own per-request failure
handling (see :mod:`handlers.batching`) or any transport.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn import init

from handlers.context import Context
from handlers.errors import PredictionException
from handlers.labels import MAPPING_FILE, load_label_mapping
from handlers.onnx_session import ONNX_SUFFIX, onnx_session, run_session
from handlers.timer import timed
from handlers.user_code import classes_defined_in, import_from_model_dir, module_name_for

logger = logging.getLogger(__name__)

TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".bin")
AOT_SUFFIX = ".so"  # a model AOTInductor compiled into a shared library


class BaseHandler:
    """Loads the archive's model in :meth:`initialize`; :meth:`handle` runs one batch.

    Subclasses override :meth:`preprocess`, :meth:`inference` and :meth:`postprocess`, each of
    which sees the whole batch. Raising fails the whole batch; for per-request failures derive
    from :class:`handlers.batching.BatchedHandler` instead.
    """

    def __init__(self) -> None:
        self.model: Any = None
        self.mapping: dict[str, str] | None = None
        self.device: torch.device | None = None
        self.map_location: str | None = None
        self.initialized = False
        self.context: Context | None = None
        self.manifest: dict[str, Any] | None = None
        self.model_pt_path: str | None = None
        self.model_yaml_config: dict[str, Any] = {}
        self.explain = False
        self.target = 0
        self.onnx = False  # the model is an onnxruntime session (a .onnx serialized file)

    # --- loading -------------------------------------------------------------------------

    def initialize(self, context: Context) -> None:
        """Choose the device, load the model and the label mapping."""
        self.context = context
        self.model_yaml_config = getattr(context, "model_yaml_config", None) or {}
        properties = context.system_properties
        gpu_id = properties.get("gpu_id")
        if gpu_id is not None and torch.cuda.is_available():
            self.map_location = "cuda"
            self.device = torch.device(f"cuda:{gpu_id}")
        else:
            self.map_location = "cpu"
            self.device = torch.device("cpu")

        self.manifest = context.manifest
        model_dir = properties["model_dir"]
        model_section = (self.manifest or {}).get("model", {})
        serialized_file = model_section.get("serializedFile")
        self.model_pt_path = os.path.join(model_dir, serialized_file) if serialized_file else None
        model_file = model_section.get("modelFile")

        if model_file:
            logger.debug("Loading eager model from %s and %s", model_file, self.model_pt_path)
            self.model = self._load_pickled_model(model_dir, model_file, self.model_pt_path)
            self.model.to(self.device)
            self.model.eval()
        elif self.model_pt_path is None:
            raise RuntimeError(
                f"Model {context.model_name!r} has neither a serializedFile nor a modelFile in its "
                "manifest; archive it with --serialized-file (TorchScript) or --model-file plus "
                "--serialized-file (eager), or give it a handler that loads the model itself."
            )
        elif self.model_pt_path.endswith(TORCHSCRIPT_SUFFIXES):
            self.model = self._load_torchscript_model(self.model_pt_path)
            self.model.eval()
        elif self.model_pt_path.endswith(ONNX_SUFFIX):
            self.model = onnx_session(self.model_pt_path, self.device)
            self.onnx = True
        elif self.model_pt_path.endswith(AOT_SUFFIX):
            self.model = self._load_aot_compiled(self.model_pt_path)
        else:
            raise RuntimeError(
                f"Serialized file {serialized_file!r} is neither TorchScript "
                f"({', '.join(TORCHSCRIPT_SUFFIXES)}), ONNX ({ONNX_SUFFIX}) nor AOTInductor "
                f"({AOT_SUFFIX}) and the archive has no modelFile; add --model-file for a state "
                "dict, or a handler that loads this format."
            )
        logger.info("Model %s loaded on %s", context.model_name, self.device)
        if not self.onnx:  # torch.compile (model-config.yaml's pt2) is for torch models
            self.model = self._compiled(self.model)

        self.mapping = load_label_mapping(os.path.join(model_dir, MAPPING_FILE))
        self.initialized = True

    def _compiled(self, model: Any) -> Any:
        """The model through ``torch.compile`` when model-config.yaml's ``pt2`` section asks,
        in TorchServe's keys (``pt2: {compile: {enable: true, backend: ..., mode: ...}}``, or
        the older ``pt2: {backend: ...}``); as it is otherwise, or when compiling fails (a
        warning: the model serves uncompiled, as TorchServe's does). A backend compiles at
        the first batch, which takes that much longer."""
        pt2 = self.model_yaml_config.get("pt2")
        if not isinstance(pt2, dict):
            return model
        options = pt2.get("compile") if "compile" in pt2 else pt2 if "backend" in pt2 else None
        if not isinstance(options, dict) or not options.get("enable", "compile" not in pt2):
            return model
        options = {key: value for key, value in options.items() if key != "enable"}
        try:
            compiled = torch.compile(model, **options)
        except Exception as exc:  # a backend or option this torch lacks: serve uncompiled
            logger.warning("torch.compile(%s) failed; the model serves uncompiled: %s",
                           options, exc)
            return model
        logger.info("Model compiled with torch.compile(%s)", options)
        return compiled

    def _load_torchscript_model(self, model_pt_path: str) -> torch.jit.ScriptModule:
        if not os.path.isfile(model_pt_path):
            raise RuntimeError(f"Serialized file {model_pt_path!r} does not exist.")
        with warnings.catch_warnings():
            # TorchScript archives are what TorchServe users have; loading them is the point.
            warnings.filterwarnings("ignore", "`torch.jit.load` is deprecated", FutureWarning)
            return torch.jit.load(model_pt_path, map_location=self.device)

    def _load_aot_compiled(self, model_so_path: str) -> Any:
        """A model compiled ahead of time by AOTInductor (``torch._export.aot_compile``) into a
        shared library, loaded as TorchServe loads it: only when model-config.yaml says so
        (``pt2: {export: {aot_compile: true}}``; a ``.so`` may be anything else), on the
        worker's device."""
        pt2 = self.model_yaml_config.get("pt2")
        export = pt2.get("export") if isinstance(pt2, dict) else None
        if not (isinstance(export, dict) and export.get("aot_compile") is True):
            raise RuntimeError(
                f"Serialized file {model_so_path!r} is a shared library: serve one compiled by "
                "AOTInductor with model-config.yaml's pt2: {export: {aot_compile: true}}, as "
                "in TorchServe."
            )
        if not os.path.isfile(model_so_path):
            raise RuntimeError(f"Serialized file {model_so_path!r} does not exist.")
        device = self.device
        assert device is not None, "initialize chooses the device before loading"
        if device.type == "cuda":  # the loader takes no device index: the worker's own
            torch.cuda.set_device(device)
        return torch._export.aot_load(model_so_path, device.type)

    def _load_pickled_model(
        self, model_dir: str, model_file: str, model_pt_path: str | None
    ) -> torch.nn.Module:
        """Instantiate the one ``nn.Module`` class defined in ``model_file`` and load its state dict."""
        model_def_path = os.path.join(model_dir, model_file)
        if not os.path.isfile(model_def_path):
            raise RuntimeError(
                f"Model file {model_file!r} is not in {model_dir!r}; archive it with --model-file."
            )
        module = import_from_model_dir(model_dir, module_name_for(model_file))
        candidates = classes_defined_in(module, torch.nn.Module)
        if len(candidates) != 1:
            found = [c.__name__ for c in candidates]
            raise ValueError(
                f"Model file {model_file!r} must define exactly one torch.nn.Module subclass; "
                f"found {len(candidates)}: {found!r}. Move helper modules to another file "
                "(--extra-files) or write a handler that builds the model."
            )
        if not model_pt_path:
            return candidates[0]()
        state = self._load_state_dict(model_pt_path)
        with parameters_left_uninitialised():
            model = candidates[0]()
        # assign: the parameters become the memory-mapped tensors themselves, so the workers
        # of a model share one copy of the weights (the page cache's). Strict: a parameter the
        # file lacks fails the load, never serves uninitialised.
        model.load_state_dict(_in_dtypes_of(model, state), assign=True)
        return model

    def _load_state_dict(self, path: str) -> dict[str, Any]:
        if not os.path.isfile(path):
            raise RuntimeError(f"Serialized file {path!r} does not exist.")
        try:
            # mmap: the tensors are the file's pages, shared by every worker that maps them.
            return torch.load(path, map_location=self.device, weights_only=True, mmap=True)
        except RuntimeError as exc:
            # Files in the legacy (non-zip) format cannot be memory-mapped.
            logger.debug("mmap load of %s failed (%s); loading without mmap", path, exc)
            return torch.load(path, map_location=self.device, weights_only=True)

    # --- one batch -------------------------------------------------------------------------

    @timed
    def preprocess(self, data: list[Any]) -> Any:
        """The batch as a tensor on the device; override for anything but numeric lists."""
        return torch.as_tensor(data, device=self.device)

    @timed
    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        """Run the model on the preprocessed batch."""
        if self.onnx:
            return run_session(self.model, data)
        with torch.inference_mode():
            return self.model(self._to_device(data), *args, **kwargs)

    @timed
    def postprocess(self, data: Any) -> list[Any]:
        """One output item per request; the default turns a batch tensor into lists."""
        return data.tolist()

    def handle(self, data: list[Any], context: Context) -> list[Any]:
        """Run one batch: ``preprocess → inference → postprocess``, or an explanation, or a
        describe call's question (``describe_handle``)."""
        start = time.perf_counter()
        self.context = context
        if self._is_describe():
            return [self.describe_handle()]
        batch = self.preprocess(data)
        if self._is_explain():
            output = self.explain_handle(batch, data)
        else:
            output = self.postprocess(self.inference(batch))
        self._record_handler_time(context, start)
        return output

    def explain_handle(self, data_preprocess: Any, raw_data: list[Any]) -> Any:
        """The explanation for a batch; needs a ``get_insights(tensor, inputs, target)`` method."""
        get_insights = getattr(self, "get_insights", None)
        if get_insights is None:
            raise PredictionException(
                f"Handler {type(self).__name__} does not support explanations; define "
                "get_insights(tensor_data, raw_input, target) or call /predictions instead.",
                400,
            )
        row = raw_data[0] if raw_data else None
        inputs, target = None, 0
        if isinstance(row, dict):
            inputs = row.get("data") if row.get("data") is not None else row.get("body")
            target = row.get("target") or 0
        return get_insights(data_preprocess, inputs, target)

    def describe_handle(self) -> Any:
        """The model's own metadata for ``GET /models/{name}?customized=true`` (shown there as
        ``customizedMetadata``; a dict, as TorchServe expects): none by default."""
        return None

    def get_device(self) -> torch.device | None:
        return self.device

    # --- helpers for subclasses ------------------------------------------------------------

    def _is_explain(self) -> bool:
        if not self.context or not self.context.request_processor:
            return False
        value = self.context.get_request_header(0, "explain")
        self.explain = value is not None and value.strip().lower() == "true"
        return self.explain

    def _is_describe(self) -> bool:
        """A describe call's question (TorchServe's ``describe: True`` header), not a request."""
        if not self.context or not self.context.request_processor:
            return False
        value = self.context.get_request_header(0, "describe")
        return value is not None and value.strip().lower() == "true"

    def _to_device(self, data: Any) -> Any:
        """Tensors, and tensors inside lists, tuples and dicts, moved to the handler's device."""
        if isinstance(data, torch.Tensor):
            return data.to(self.device)
        if isinstance(data, list):
            return [self._to_device(d) for d in data]
        if isinstance(data, tuple):
            items = [self._to_device(d) for d in data]
            return type(data)(*items) if hasattr(data, "_fields") else tuple(items)
        if isinstance(data, dict):
            return {k: self._to_device(v) for k, v in data.items()}
        return data

    @staticmethod
    def _record_handler_time(context: Context, start: float) -> None:
        metrics = getattr(context, "metrics", None)
        if metrics is not None:
            metrics.add_time(
                "HandlerTime", round((time.perf_counter() - start) * 1000, 2), None, "ms"
            )


def _in_dtypes_of(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each floating tensor in its parameter's dtype: an assigned tensor keeps
    its own, and TorchServe's copying load gives a half-precision file's weights the model's
    float32 (as its inputs have). Tensors already right stay the file's mapped pages."""
    own = model.state_dict()
    converted = dict(state)
    for key, tensor in state.items():
        mine = own.get(key)
        if (mine is not None and isinstance(tensor, torch.Tensor) and tensor.dtype != mine.dtype
                and tensor.is_floating_point() and mine.is_floating_point()):
            converted[key] = tensor.to(mine.dtype)
    return converted


_INITIALISERS = ("constant_", "dirac_", "eye_", "kaiming_normal_", "kaiming_uniform_", "normal_",
                 "ones_", "orthogonal_", "sparse_", "trunc_normal_", "uniform_", "xavier_normal_",
                 "xavier_uniform_", "zeros_")


@contextlib.contextmanager
def parameters_left_uninitialised() -> Iterator[None]:
    """Build a model whose state dict is loaded next without drawing its parameters' random
    initial values, which the load replaces: ``torch.nn.init``'s functions leave an
    ``nn.Parameter`` as it is (ResNet-18: 0.16 s of a worker's start-up -> 0.01 s). Anything
    else they are given (a buffer, say, which a state dict may not hold) is initialised as
    usual. ``transformers`` builds its models the same way; the meta device would import
    ``torch._dynamo`` (1.5 s)."""
    saved = {name: getattr(init, name) for name in _INITIALISERS if hasattr(init, name)}

    def skipping(initialise):
        def initialise_unless_parameter(tensor, *args, **kwargs):
            if isinstance(tensor, torch.nn.Parameter):
                return tensor
            return initialise(tensor, *args, **kwargs)
        return initialise_unless_parameter

    for name, initialise in saved.items():
        setattr(init, name, skipping(initialise))
    try:
        yield
    finally:
        for name, initialise in saved.items():
            setattr(init, name, initialise)
