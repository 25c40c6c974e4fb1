"""A transformers model folder (config.json, weights, tokenizer) served without packaging.

A Hugging Face user has a folder, not an archive. ``read`` gives such a folder what an archive
would carry: a manifest naming the built-in handler its ``config.json`` calls for
(``causal_lm`` for a ``...ForCausalLM`` or ``...LMHeadModel``, ``text_embedder`` for an encoder,
``text_reranker`` for a cross-encoder: a ``...ForSequenceClassification`` with one label) and
the settings that suit that handler (continuous batching for generation). A
``model-config.yaml`` inside the folder overrides those settings. The folder is served where it
lies: it is never copied, and never deleted when its model is unregistered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from archiver import ArchiveError, Manifest
from archiver.manifest import validate_model_name
from mservd.config import read_model_yaml

CONFIG_FILE = "config.json"
MODEL_YAML = "model-config.yaml"
WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model")

#: What a folder's model is served with when its own model-config.yaml does not say.
SETTINGS = {
    "causal_lm": {"batchSize": 16, "maxBatchDelay": 5, "responseTimeout": 120,
                  "continuousBatching": True},
    "text_embedder": {"batchSize": 8, "maxBatchDelay": 5},
    "text_reranker": {"batchSize": 8, "maxBatchDelay": 5},
}


class FolderError(ValueError):
    """The folder cannot be served as it is; the message says what is missing."""


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    name: str
    handler: str
    model_yaml: dict[str, Any]

    @property
    def manifest(self) -> dict[str, Any]:
        return Manifest(model_name=self.name, handler=self.handler).to_dict()


def is_model_folder(path: Path) -> bool:
    """A folder with a config.json and no archive manifest (a model archive's folder, with
    MAR-INF, is unpacked like any archive)."""
    return path.is_dir() and (path / CONFIG_FILE).is_file() and not (path / "MAR-INF").exists()


def read(path: Path, name: str | None = None) -> ModelFolder:
    """What serving ``path`` takes: its model name (the folder's name unless given), handler
    and settings.

    :raises FolderError: no usable config.json, weights or tokenizer, or an architecture that
        no built-in handler serves.
    """
    try:
        config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FolderError(f"{str(path)!r}: {CONFIG_FILE} cannot be read as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise FolderError(f"{str(path)!r}: {CONFIG_FILE} is not a JSON object.")
    if not any(any(path.glob(pattern)) for pattern in WEIGHTS):
        raise FolderError(f"{str(path)!r} has a {CONFIG_FILE} but no weights "
                          "(model.safetensors or pytorch_model.bin): save the model with "
                          "save_pretrained() into it.")
    if not any((path / file).is_file() for file in TOKENIZER):
        raise FolderError(f"{str(path)!r} has no tokenizer files ({', '.join(TOKENIZER)}): "
                          "save the tokenizer with save_pretrained() into it.")
    handler = handler_for(config, path)
    model_name = name or path.name
    try:
        validate_model_name(model_name)
    except ArchiveError as exc:
        raise FolderError(f"{str(path)!r}: {exc} Give the model a name: --models NAME=FOLDER "
                          "or model_name=NAME.") from None
    own = read_model_yaml(path / MODEL_YAML) if (path / MODEL_YAML).is_file() else {}
    return ModelFolder(path, model_name, handler, {**SETTINGS[handler], **own})


def handler_for(config: dict[str, Any], path: Path) -> str:
    """The built-in handler for a model whose config.json is ``config``."""
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list):
        architectures = []
    if any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        return "causal_lm"
    if not architectures or any(str(a).endswith(("Model", "ForMaskedLM"))
                                for a in architectures):
        return "text_embedder"
    labels = config.get("id2label")
    labels = len(labels) if isinstance(labels, dict) else config.get("num_labels", 2)
    if any(str(a).endswith("ForSequenceClassification") for a in architectures) \
            and labels == 1:
        return "text_reranker"
    raise FolderError(f"{str(path)!r} holds a {', '.join(map(str, architectures))}" + (
        f" with {labels} labels" if "ForSequenceClassification" in str(architectures) else "")
        + ": the built-in handlers serve causal language models (text generation), text "
        "encoders (embeddings) and cross-encoders (reranking: a sequence classifier with one "
        "label). Package it with a handler of your own (model-archiver --handler).")
