"""``samples/build_all.py`` loaded as a module, for the unit tests that build sample archives."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_build_all() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_samples_build_all", REPO / "samples" / "build_all.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
