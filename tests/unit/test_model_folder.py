"""Which built-in handler and settings a transformers model folder is served with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mservd.config import Settings
from mservd.controller.daemon import startup_models
from mservd.controller.model_folder import FolderError, is_model_folder, read


def make_folder(path: Path, architectures: list[str] | None, *, weights: bool = True,
                tokenizer: bool = True) -> Path:
    path.mkdir(parents=True)
    config = {"model_type": "x"} if architectures is None else {"architectures": architectures}
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        (path / "model.safetensors").write_bytes(b"\0")
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    return path


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "GPT2LMHeadModel"])
def test_a_causal_lm_gets_causal_lm_with_continuous_batching(tmp_path, architecture) -> None:
    folder = read(make_folder(tmp_path / "m", [architecture]))
    assert folder.handler == "causal_lm" and folder.name == "m"
    assert folder.model_yaml["continuousBatching"] is True
    assert folder.manifest["model"] == {"modelName": "m", "modelVersion": "1.0",
                                        "handler": "causal_lm"}


@pytest.mark.parametrize("architectures", [["BertModel"], ["BertForMaskedLM"], None])
def test_an_encoder_gets_the_text_embedder(tmp_path, architectures) -> None:
    assert read(make_folder(tmp_path / "e", architectures), "emb").handler == "text_embedder"


def test_a_one_label_sequence_classifier_gets_the_text_reranker(tmp_path) -> None:
    path = make_folder(tmp_path / "r", ["BertForSequenceClassification"])
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "id2label": {"0": "LABEL_0"}}))
    folder = read(path)
    assert folder.handler == "text_reranker" and folder.model_yaml["batchSize"] == 8


def test_a_classifier_of_several_labels_is_no_reranker(tmp_path) -> None:
    path = make_folder(tmp_path / "c", ["BertForSequenceClassification"])
    with pytest.raises(FolderError, match="with 2 labels.*one label"):
        read(path)


def test_the_folders_model_config_yaml_overrides_the_defaults(tmp_path) -> None:
    path = make_folder(tmp_path / "m", ["LlamaForCausalLM"])
    (path / "model-config.yaml").write_text("batchSize: 4\nhandler:\n  max_new_tokens: 9\n")
    folder = read(path)
    assert folder.model_yaml["batchSize"] == 4 and folder.model_yaml["continuousBatching"]
    assert folder.model_yaml["handler"] == {"max_new_tokens": 9}


@pytest.mark.parametrize("kwargs, words", [
    ({"architectures": ["T5ForConditionalGeneration"]}, "T5ForConditionalGeneration"),
    ({"architectures": ["LlamaForCausalLM"], "weights": False}, "no weights"),
    ({"architectures": ["LlamaForCausalLM"], "tokenizer": False}, "no tokenizer files"),
])
def test_a_folder_that_cannot_be_served_says_why(tmp_path, kwargs, words) -> None:
    with pytest.raises(FolderError, match=words):
        read(make_folder(tmp_path / "m", **kwargs))


def test_a_folder_name_that_is_no_model_name_asks_for_one(tmp_path) -> None:
    with pytest.raises(FolderError, match="Give the model a name"):
        read(make_folder(tmp_path / "has space", ["BertModel"]))


def test_an_archive_folder_is_not_a_model_folder(tmp_path) -> None:
    path = make_folder(tmp_path / "m", ["BertModel"])
    assert is_model_folder(path)
    (path / "MAR-INF").mkdir()
    assert not is_model_folder(path)


def test_all_loads_the_stores_archives_and_model_folders(tmp_path) -> None:
    make_folder(tmp_path / "enc", ["BertModel"])
    (tmp_path / "tiny.mar").write_bytes(b"")
    (tmp_path / "notes").mkdir()
    settings = Settings(model_store=str(tmp_path), load_models=("all",))
    assert startup_models(settings) == [(None, "enc"), (None, "tiny.mar")]
