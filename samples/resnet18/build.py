"""Build ``resnet18.mar``: ResNet-18 (torchvision's architecture in plain torch) with seeded
random weights (nothing downloaded).

The weights and ``index_to_name.json`` (``class_<i>``) are made here at build time, so nothing
large is committed. Served by the built-in ``image_classifier``; the predictions are meaningless,
the compute is real: this is the compute-bound benchmark model.

    .venv/bin/python samples/resnet18/build.py [EXPORT_PATH]
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import archiver

HERE = Path(__file__).resolve().parent
MODEL_STORE = HERE.parents[1] / "model_store"
NAME = "resnet18"
SEED = 0
#: Declares the v2 tensors (``GET /v2/models/resnet18``); no worker settings.
CONFIG = HERE / "model-config.yaml"


def sources() -> tuple[Path, ...]:
    """What the archive is made of: it is out of date when any of these is newer."""
    return (HERE / "build.py", HERE / "resnet18_model.py", CONFIG)


def build(export_path: str | Path = MODEL_STORE) -> Path:
    """Write ``resnet18.mar`` into ``export_path`` (created if missing) and return its path."""
    import torch

    spec = importlib.util.spec_from_file_location(
        "_resnet18_model_build", HERE / "resnet18_model.py"
    )
    assert spec is not None and spec.loader is not None
    resnet18_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(resnet18_model)

    Path(export_path).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="resnet18-build-") as tmp:
        torch.manual_seed(SEED)
        weights = Path(tmp) / "resnet18.pt"
        torch.save(resnet18_model.ResNet18().state_dict(), weights)
        names = Path(tmp) / "index_to_name.json"
        names.write_text(json.dumps({str(i): f"class_{i}" for i in range(1000)}))
        return archiver.write_archive(
            model_name=NAME,
            handler="image_classifier",
            model_file=HERE / "resnet18_model.py",
            serialized_file=weights,
            extra_files=[names],
            config_file=CONFIG,
            export_path=export_path,
            force=True,
        )


if __name__ == "__main__":
    print(build(*sys.argv[1:2]))
