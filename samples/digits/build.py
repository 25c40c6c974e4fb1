"""Build ``digits.mar``: the CNN trained by ``train.py`` on scikit-learn's 8x8 digits.

Serves the committed ``digits_cnn.pt``; when it is missing, trains it first (under a minute).

    .venv/bin/python samples/digits/build.py [EXPORT_PATH]
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import archiver

HERE = Path(__file__).resolve().parent
MODEL_STORE = HERE.parents[1] / "model_store"
NAME = "digits"
WEIGHTS = HERE / "digits_cnn.pt"
LABELS = HERE / "index_to_name.json"
#: Declares the v2 tensors (``GET /v2/models/digits``); no worker settings.
CONFIG = HERE / "model-config.yaml"


def sources() -> tuple[Path, ...]:
    """What the archive is made of: it is out of date when any of these is newer."""
    local = (HERE / "build.py", HERE / "digits_model.py", HERE / "digits_handler.py", CONFIG)
    return local + ((WEIGHTS, LABELS) if WEIGHTS.is_file() and LABELS.is_file() else ())


def build(export_path: str | Path = MODEL_STORE) -> Path:
    """Write ``digits.mar`` into ``export_path`` (created if missing) and return its path."""
    if not (WEIGHTS.is_file() and LABELS.is_file()):
        spec = importlib.util.spec_from_file_location("_digits_train", HERE / "train.py")
        assert spec is not None and spec.loader is not None
        train = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(train)
        train.train()
    Path(export_path).mkdir(parents=True, exist_ok=True)
    return archiver.write_archive(
        model_name=NAME,
        handler=str(HERE / "digits_handler.py"),
        model_file=HERE / "digits_model.py",
        serialized_file=WEIGHTS,
        extra_files=[LABELS],
        config_file=CONFIG,
        export_path=export_path,
        force=True,
    )


if __name__ == "__main__":
    print(build(*sys.argv[1:2]))
