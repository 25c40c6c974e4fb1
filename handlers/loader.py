"""Turning a manifest's ``handler`` value into something the worker can call.

This module owns TorchServe's handler resolution rules (``ts/model_loader.py``):

* ``name`` / ``name.py`` / ``dir/name.py``: the module ``name`` from the model directory, else a
  built-in (``image_classifier``, ...), else an installed module. If the module has a function
  ``handle``, that is the entry point; otherwise it must define exactly one class, which is
  instantiated and whose ``initialize`` and ``handle`` are used.
* ``name:function``: the module's ``function`` is the entry point.

A function entry point is called once as ``function(None, context)`` at initialize time, then
``function(data, context)`` per batch, as in TorchServe.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from handlers.context import Context
from handlers.user_code import (
    classes_defined_in,
    defines,
    import_from_model_dir,
    module_name_for,
)

logger = logging.getLogger(__name__)

BUILTIN_HANDLERS = {
    "base_handler": "handlers.base_handler:BaseHandler",  # TorchServe's, for a plain model
    "causal_lm": "handlers.causal_lm:CausalLM",
    "image_classifier": "handlers.image_classifier:ImageClassifier",
    "image_segmenter": "handlers.image_segmenter:ImageSegmenter",
    "object_detector": "handlers.object_detector:ObjectDetector",
    "text_classifier": "handlers.text_classifier:TextClassifier",
    "text_embedder": "handlers.text_embedder:TextEmbedder",
    "text_reranker": "handlers.text_reranker:TextReranker",
}


class HandlerLoadError(Exception):
    """The handler named in the manifest cannot be found, imported or used."""


@dataclass
class LoadedHandler:
    """A resolved handler: call :meth:`initialize` once, then :meth:`handle` per batch.

    :param service: the handler instance for a class handler, ``None`` for a function.
    :param description: what was loaded, for logs: ``"class my_handler.MyHandler"``.
    """

    entry_point: Callable[[Any, Context], Any]
    initialize_fn: Callable[[Context], Any] | None
    service: Any
    description: str

    def initialize(self, context: Context) -> None:
        if self.initialize_fn is not None:
            self.initialize_fn(context)

    def handle(self, data: list[Any], context: Context) -> Any:
        return self.entry_point(data, context)


def load_handler(model_dir: str, handler: str) -> LoadedHandler:
    """Resolve ``handler`` (a manifest's ``handler`` value) for the model in ``model_dir``."""
    if not handler or not handler.strip():
        raise HandlerLoadError(
            "The manifest names no handler; archive the model with --handler set to a built-in "
            f"({', '.join(BUILTIN_HANDLERS)}) or a file.py[:function] in the archive."
        )
    spec, _, function_name = handler.strip().partition(":")
    module_name = module_name_for(spec)

    if defines(model_dir, module_name):
        module = _import(model_dir, module_name, handler)
    elif module_name in BUILTIN_HANDLERS and not function_name:
        return _builtin(module_name)
    elif spec.endswith(".py"):
        raise HandlerLoadError(
            f"Handler file {spec!r} is not in the model directory {model_dir!r}. Add it to the "
            "archive with --handler (or --extra-files), or use a built-in: "
            f"{', '.join(BUILTIN_HANDLERS)}."
        )
    else:
        module = _import(model_dir, module_name, handler)

    if function_name:
        function = getattr(module, function_name, None)
        if not callable(function):
            raise HandlerLoadError(
                f"Handler {handler!r}: module {module_name!r} has no function {function_name!r}. "
                f"Define {function_name}(data, context) in it, or drop ':{function_name}' to use "
                "its handler class."
            )
        return _function_entry(function, f"function {module_name}.{function_name}")
    function = getattr(module, "handle", None)
    if callable(function) and not isinstance(function, type):
        return _function_entry(function, f"function {module_name}.handle")
    return _class_entry(module, handler)


def _import(model_dir: str, module_name: str, handler: str) -> ModuleType:
    try:
        return import_from_model_dir(model_dir, module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise HandlerLoadError(
                f"Handler {handler!r} is not a file in the model directory {model_dir!r}, not a "
                f"built-in ({', '.join(BUILTIN_HANDLERS)}) and not an installed module. Add "
                f"{module_name}.py to the archive with --handler."
            ) from None
        raise HandlerLoadError(
            f"Handler module {module_name!r} imports {exc.name!r}, which is not installed; add it "
            "to the archive's requirements file (--requirements-file) or install it."
        ) from exc
    except Exception as exc:
        raise HandlerLoadError(
            f"Handler module {module_name!r} from {model_dir!r} failed to import: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _builtin(name: str) -> LoadedHandler:
    module_path, _, class_name = BUILTIN_HANDLERS[name].partition(":")
    handler_class = getattr(importlib.import_module(module_path), class_name)
    service = handler_class()
    return LoadedHandler(service.handle, service.initialize, service, f"built-in {name}")


def _function_entry(function: Callable[[Any, Context], Any], description: str) -> LoadedHandler:
    # TorchServe calls the entry point with data=None once at load time; handlers rely on it
    # to initialize themselves.
    return LoadedHandler(function, lambda ctx: function(None, ctx), None, description)


def _class_entry(module: ModuleType, handler: str) -> LoadedHandler:
    classes = classes_defined_in(module)
    if len(classes) != 1:
        names = [c.__name__ for c in classes]
        where = os.path.basename(getattr(module, "__file__", "") or module.__name__)
        if not classes:
            raise HandlerLoadError(
                f"Handler {handler!r}: {where} defines no class and no handle(data, context) "
                "function; define one handler class or a handle function, or name a function "
                f"with '{module.__name__}:function'."
            )
        raise HandlerLoadError(
            f"Handler {handler!r}: {where} defines {len(classes)} classes {names!r}; it must "
            "define exactly one (move the others to another file) or name a function with "
            f"'{module.__name__}:function'."
        )
    handler_class = classes[0]
    try:
        service = handler_class()
    except Exception as exc:
        raise HandlerLoadError(
            f"Handler class {handler_class.__name__} could not be created with no arguments: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not callable(getattr(service, "handle", None)):
        raise HandlerLoadError(
            f"Handler class {handler_class.__name__} in {module.__name__} has no "
            "handle(data, context) method; add one or derive from BaseHandler."
        )
    initialize = getattr(service, "initialize", None)
    return LoadedHandler(
        service.handle,
        initialize if callable(initialize) else None,
        service,
        f"class {module.__name__}.{handler_class.__name__}",
    )
