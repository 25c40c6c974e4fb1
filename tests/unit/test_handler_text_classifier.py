"""The text_classifier built-in with a TorchServe-style vocabulary and with a Hugging Face tokenizer."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import torch

from handlers.context import Context
from handlers.errors import RequestError
from handlers.text_classifier import TextClassifier
from handlers.text_handler import clean_text, ngrams

torch.set_num_threads(1)

WORDS = ["<unk>", "good", "bad", "movie", "great", "awful", "good movie", "bad movie"]

MODEL_PY = """
import torch


class BagClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.EmbeddingBag(8, 4, mode="mean")
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))
"""

PADDED_MODEL_PY = """
import torch


class PaddedClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(16, 4)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embedding(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return (self.fc(pooled),)
"""


def load(model_dir: Path, model_file: str, n: int) -> tuple[TextClassifier, Context]:
    manifest = {"model": {"serializedFile": "weights.pth", "modelFile": model_file}}
    ctx = Context("text", str(model_dir), manifest, n, None, "0.1.0")
    ctx.begin_batch([str(i) for i in range(n)], [{}] * n)
    handler = TextClassifier()
    handler.initialize(ctx)
    return handler, ctx


def write_model(model_dir: Path, name: str, source: str) -> None:
    (model_dir / f"{name}.py").write_text(source)
    namespace = runpy.run_path(str(model_dir / f"{name}.py"))
    [cls] = [v for k, v in namespace.items() if isinstance(v, type) and k != "torch"]
    torch.manual_seed(0)
    torch.save(cls().state_dict(), model_dir / "weights.pth")  # type: ignore[operator]


@pytest.fixture()
def vocab_dir(tmp_path: Path) -> Path:
    write_model(tmp_path, "bag_model", MODEL_PY)
    torch.save({w: i for i, w in enumerate(WORDS)}, tmp_path / "source_vocab.pt")
    (tmp_path / "index_to_name.json").write_text(json.dumps({"0": "negative", "1": "positive"}))
    return tmp_path


def test_text_classifier_batch_gives_label_probabilities_in_order(vocab_dir: Path) -> None:
    handler, ctx = load(vocab_dir, "bag_model.py", 3)
    texts = ["A <b>good</b> movie!", "bad movie", "Great, great, GREAT."]
    outputs = handler.handle(
        [{"data": texts[0].encode()}, {"body": texts[1]}, {"data": bytearray(texts[2].encode())}],
        ctx,
    )
    assert len(outputs) == 3
    for out in outputs:
        assert set(out) == {"negative", "positive"}
        assert sum(out.values()) == pytest.approx(1.0)
    for i, text in enumerate(texts):
        [alone] = handler.handle([{"data": text}], ctx)
        assert alone == pytest.approx(outputs[i])


def test_text_classifier_bad_input_fails_only_its_request(vocab_dir: Path) -> None:
    handler, ctx = load(vocab_dir, "bag_model.py", 3)
    outputs = handler.handle(
        [{"data": b"good"}, {"data": b"\xff\xfe\xfa"}, {"body": {"text": 1}}], ctx
    )
    assert isinstance(outputs[0], dict)
    assert outputs[1] == RequestError(400, "The input is not UTF-8 text.")
    assert isinstance(outputs[2], RequestError) and "Expected text" in outputs[2].message


def test_text_classifier_tokenizes_like_torchserve() -> None:
    assert clean_text("<p>Café, GOOD!</p>").split() == ["cafe", "good"]
    assert list(ngrams(["a", "b", "c"], 2)) == ["a", "b", "c", "a b", "b c"]


def test_text_classifier_uses_a_hugging_face_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "good": 2, "bad": 3, "movie": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]"
    ).save_pretrained(tmp_path)
    write_model(tmp_path, "padded_model", PADDED_MODEL_PY)

    handler, ctx = load(tmp_path, "padded_model.py", 2)
    outputs = handler.handle([{"data": "good movie"}, {"data": "bad"}], ctx)
    assert [set(o) for o in outputs] == [{"0", "1"}, {"0", "1"}]
    [alone] = handler.handle([{"data": "bad"}], ctx)
    assert alone == pytest.approx(outputs[1], abs=1e-6)


def test_text_classifier_without_tokenizer_says_what_to_add(tmp_path: Path) -> None:
    write_model(tmp_path, "bag_model", MODEL_PY)
    with pytest.raises(RuntimeError, match="has no tokenizer: put a source_vocab.pt"):
        load(tmp_path, "bag_model.py", 1)
