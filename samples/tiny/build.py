"""Build ``tiny.mar``: the 64 -> 256 -> 10 MLP with seeded weights, made here at build time.

.venv/bin/python samples/tiny/build.py [EXPORT_PATH]
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import archiver

HERE = Path(__file__).resolve().parent
MODEL_STORE = HERE.parents[1] / "model_store"
NAME = "tiny"
SEED = 0
#: Declares the v2 tensors (``GET /v2/models/tiny``); no worker settings.
CONFIG = HERE / "model-config.yaml"


def sources() -> tuple[Path, ...]:
    """What the archive is made of: it is out of date when any of these is newer."""
    return (HERE / "build.py", HERE / "tiny_model.py", HERE / "tiny_handler.py", CONFIG)


def build(export_path: str | Path = MODEL_STORE) -> Path:
    """Write ``tiny.mar`` into ``export_path`` (created if missing) and return its path."""
    import torch

    spec = importlib.util.spec_from_file_location("_tiny_model_build", HERE / "tiny_model.py")
    assert spec is not None and spec.loader is not None
    tiny_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny_model)

    Path(export_path).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tiny-build-") as tmp:
        torch.manual_seed(SEED)
        weights = Path(tmp) / "tiny_mlp.pt"
        torch.save(tiny_model.TinyMLP().state_dict(), weights)
        return archiver.write_archive(
            model_name=NAME,
            handler=str(HERE / "tiny_handler.py"),
            model_file=HERE / "tiny_model.py",
            serialized_file=weights,
            config_file=CONFIG,
            export_path=export_path,
            force=True,
        )


if __name__ == "__main__":
    print(build(*sys.argv[1:2]))
