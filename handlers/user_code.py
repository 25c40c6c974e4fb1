"""Importing the Python files an archive ships (handler files, model definition files).

This module owns how a name in a model directory becomes a module: the directory goes first on
``sys.path`` and the module is imported by name, as TorchServe does, so the archive's files can
import each other. A module of the same name cached from another model directory is replaced,
which matters when one process (a test run, ``mservd run-handler``) loads several archives.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from types import ModuleType

logger = logging.getLogger(__name__)


def module_name_for(path_or_name: str) -> str:
    """``"sub/my_handler.py"`` → ``"my_handler"``; a module name is returned unchanged."""
    name = path_or_name
    if name.endswith(".py"):
        name = os.path.basename(name)[: -len(".py")]
    return name


def defines(model_dir: str, module_name: str) -> bool:
    """Whether ``model_dir`` holds the top-level module or package ``module_name``."""
    top = module_name.split(".", 1)[0]
    return os.path.isfile(os.path.join(model_dir, top + ".py")) or os.path.isfile(
        os.path.join(model_dir, top, "__init__.py")
    )


def import_from_model_dir(model_dir: str, module_name: str) -> ModuleType:
    """Import ``module_name`` with ``model_dir`` first on ``sys.path``.

    Raises whatever the import raises (``ModuleNotFoundError``, ``SyntaxError``, ...); callers
    turn that into their own error with the fix.
    """
    model_dir = os.path.abspath(model_dir)
    if model_dir in sys.path:
        sys.path.remove(model_dir)
    sys.path.insert(0, model_dir)
    if defines(model_dir, module_name):
        _forget_foreign(model_dir, module_name)
    importlib.invalidate_caches()
    return importlib.import_module(module_name)


def _forget_foreign(model_dir: str, module_name: str) -> None:
    """Drop cached modules named like ours that were loaded from somewhere else."""
    top = module_name.split(".", 1)[0]
    if top in sys.stdlib_module_names:
        raise ImportError(
            f"The file {top!r} in {model_dir!r} has the name of a standard library module; "
            "rename it so it does not shadow the standard library.",
            name=module_name,
        )
    cached = sys.modules.get(top)
    cached_file = getattr(cached, "__file__", None) or ""
    if cached is None or os.path.abspath(cached_file).startswith(model_dir + os.sep):
        return
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        logger.debug("Replacing module %r loaded from %r", name, cached_file)
        del sys.modules[name]


def classes_defined_in(module: ModuleType, parent: type | None = None) -> list[type]:
    """Classes defined in ``module`` itself (not imported into it), optionally subclasses of
    ``parent``, in name order (TorchServe's ``list_classes_from_module``)."""
    return [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and (parent is None or issubclass(cls, parent))
    ]
