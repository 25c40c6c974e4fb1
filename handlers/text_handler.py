"""``TextHandler``: decoding one request into text, and text into model input, for text built-ins.

This module owns the two tokenizers a text archive can ship, tried in this order:

* ``source_vocab.pt`` (TorchServe's; or the manifest's ``model.sourceVocab``): a ``torch.save``d
  ``{token: index}`` dict or token list. Text is cleaned and split like TorchServe's
  ``TextHandler`` (HTML tags, case, accents and punctuation removed; words plus n-grams), and the
  model is called as ``model(token_ids, offsets)`` — the ``nn.EmbeddingBag`` convention.
* a Hugging Face tokenizer saved in the model directory (``tokenizer.json`` or
  ``tokenizer_config.json``), loaded with ``local_files_only=True``; the model is called as
  ``model(input_ids, attention_mask)``.
"""

from __future__ import annotations

import logging
import os
import re
import string
import unicodedata
from collections.abc import Hashable, Iterator
from typing import Any

import torch

from handlers.batching import BatchedHandler
from handlers.context import Context
from handlers.errors import BadInputError
from handlers.vision_handler import request_input

logger = logging.getLogger(__name__)

VOCAB_FILE = "source_vocab.pt"
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
UNKNOWN_TOKEN = "<unk>"

_HTML_TAG = re.compile(r"<.*?>|&([a-z0-9]+|#[0-9]{1,6}|#x[0-9a-f]{1,6});")
_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")


def clean_text(text: str) -> str:
    """TorchServe's text cleaning: HTML tags, accents and punctuation removed, lower case."""
    text = _HTML_TAG.sub("", text).lower()
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return _PUNCTUATION.sub(" ", text)


def ngrams(tokens: list[str], n: int) -> Iterator[str]:
    """The tokens, then every run of 2..n consecutive tokens joined by a space."""
    yield from tokens
    for size in range(2, n + 1):
        for start in range(len(tokens) - size + 1):
            yield " ".join(tokens[start : start + size])


class TextHandler(BatchedHandler):
    """Text in; token tensors (vocabulary) or strings (Hugging Face tokenizer) per request.

    :attr ngrams: the longest n-gram looked up in a ``source_vocab.pt`` vocabulary.
    :attr max_length: the longest input a Hugging Face tokenizer passes to the model.
    """

    ngrams = 2
    max_length = 512

    def initialize(self, context: Context) -> None:
        super().initialize(context)
        model_dir = context.system_properties["model_dir"]
        vocab_name = (self.manifest or {}).get("model", {}).get("sourceVocab") or VOCAB_FILE
        vocab_path = os.path.join(model_dir, vocab_name)
        self.source_vocab: dict[str, int] | None = None
        self.tokenizer: Any = None
        if os.path.isfile(vocab_path):
            self.source_vocab = self._load_vocab(vocab_path)
            self.unknown_index = self.source_vocab.get(UNKNOWN_TOKEN, 0)
        elif any(os.path.isfile(os.path.join(model_dir, f)) for f in HF_TOKENIZER_FILES):
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        else:
            raise RuntimeError(
                f"Model {context.model_name!r} has no tokenizer: put a {VOCAB_FILE} vocabulary "
                f"or a Hugging Face tokenizer ({' or '.join(HF_TOKENIZER_FILES)}) in the archive "
                "with --extra-files."
            )

    @staticmethod
    def _load_vocab(path: str) -> dict[str, int]:
        vocab = torch.load(path, weights_only=True)
        if isinstance(vocab, (list, tuple)):
            vocab = {str(token): i for i, token in enumerate(vocab)}
        if not isinstance(vocab, dict):
            raise TypeError(
                f"Vocabulary {path!r} holds a {type(vocab).__name__}; save a {{token: index}} "
                "dict or a list of tokens with torch.save (torchtext Vocab objects are not read)."
            )
        return {str(k): int(v) for k, v in vocab.items()}

    def decode_text(self, row: Any) -> str:
        """A request's input as a string; bytes must be UTF-8."""
        text = request_input(row)
        if isinstance(text, (bytes, bytearray)):
            try:
                return bytes(text).decode("utf-8")
            except UnicodeDecodeError:
                raise BadInputError("The input is not UTF-8 text.") from None
        if isinstance(text, str):
            return text
        raise BadInputError(f"Expected text, got a JSON {type(text).__name__}; send plain text.")

    def decode_request(self, row: Any) -> Any:
        text = self.decode_text(row)
        if self.source_vocab is None:
            return text
        tokens = clean_text(text).split()
        ids = [self.source_vocab.get(t, self.unknown_index) for t in ngrams(tokens, self.ngrams)]
        return torch.as_tensor(ids, dtype=torch.long)

    def group_key(self, value: Any) -> Hashable:
        # Token lists of any length go into one call: offsets or padding join them.
        return None

    def collate(self, values: list[Any]) -> Any:
        if self.source_vocab is not None:
            lengths = torch.as_tensor([0] + [len(v) for v in values[:-1]], dtype=torch.long)
            return torch.cat(values), torch.cumsum(lengths, dim=0)
        encoded = self.tokenizer(
            values, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return encoded["input_ids"], encoded["attention_mask"]

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        first, second = data
        output = super().inference(first, self._to_device(second), *args, **kwargs)
        if hasattr(output, "logits"):
            return output.logits
        if isinstance(output, dict) and "logits" in output:
            return output["logits"]
        if isinstance(output, (tuple, list)):
            return output[0]
        return output
