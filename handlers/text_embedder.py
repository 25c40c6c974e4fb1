"""The built-in ``text_embedder`` handler: one text in, one embedding (a list of floats) out.

It serves any transformers text encoder whose files (config, weights, tokenizer) are in the
model directory: an archive's, or a model folder served as it is (``mservd/controller/model_folder.py``).
``initialize`` loads them with ``local_files_only`` and never touches the network. A batch is
tokenised with padding, run once, pooled and, by default, L2-normalised: what
sentence-transformers does. A sentence-transformers folder's own files choose the pooling
(``1_Pooling/config.json``: mean or CLS token), whether to normalise (``modules.json`` lists
``Normalize``) and the length (``sentence_bert_config.json``); model-config.yaml's ``handler:``
``pooling``, ``normalize`` and ``max_length`` override them.

Each embedding is a list of floats that also says how many tokens its text ran as
(``Embedding.prompt_tokens``): OpenAI's ``usage.prompt_tokens`` is their sum; any other protocol
sees the list.

Input per request: a text body (``str`` or bytes), a JSON string, or JSON ``{"text": "..."}``.
A request without usable text fails alone with 400, whatever its bytes hold (JSON nested
too deeply to parse included).

The texts of a batch are tokenised without padding, ordered by length and run in passes of at
most ``max_batch_tokens`` padded tokens (model-config.yaml ``handler:``, default 8192), so a
short text never pays for a long one's padding and one pass's memory is bounded whatever the
batch holds. How many texts one request may carry is the codec's bound
(``mservd/worker/codecs/openai.py``: the KServe V1 cap).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Must be set before transformers/huggingface_hub are imported: they read it once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer
from transformers.utils import logging as transformers_logging

from handlers import BaseHandler, RequestError

DEFAULT_MAX_LENGTH = 512
DEFAULT_MAX_BATCH_TOKENS = 8192  # padded tokens of one forward pass
PADDING_SLACK = 16  # tokens of padding any text may carry, however short


class Embedding(list):
    """One text's vector (a list of floats, as every protocol answers it), with the number of
    tokens its text ran as (special tokens included, after truncation)."""

    prompt_tokens: int = 0


class TextEmbedder(BaseHandler):
    def initialize(self, context: Any) -> None:
        model_dir = context.system_properties.get("model_dir")
        self.device = device_for(context)
        handler_config = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        found = _sentence_transformers_settings(model_dir)
        self.max_length = int(handler_config.get("max_length", found["max_length"]))
        self.pooling = str(handler_config.get("pooling", found["pooling"]))
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"handler.pooling must be 'mean' or 'cls', got {self.pooling!r}")
        self.normalize = bool(handler_config.get("normalize", found["normalize"]))
        self.max_batch_tokens = max_batch_tokens(handler_config, self.max_length)
        # A progress bar per worker start is noise in the worker log.
        transformers_logging.disable_progress_bar()
        self.context = context
        self.manifest = context.manifest
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.model = AutoModel.from_pretrained(model_dir, local_files_only=True)
        self.model.to(self.device).eval()
        self.initialized = True

    def preprocess(self, data: list[dict[str, Any]]) -> list[list[int]]:
        """Each usable text's token ids (truncated to ``max_length``, no padding)."""
        texts: list[str] = []
        # Per batch: the row of each request in the tensors, or why it has none.
        self._slots: list[int | str] = []
        for request in data:
            text, problem = _text_of(request)
            if text is None:
                self._slots.append(problem)
            else:
                self._slots.append(len(texts))
                texts.append(text)
        if not texts:
            self._tokens: list[int] = []
            return []
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
        self._tokens = [len(row) for row in ids]
        return ids

    def inference(self, data: list[list[int]], *args: Any, **kwargs: Any) -> torch.Tensor:
        """One vector per text, from passes over texts of similar length."""
        vectors = torch.empty((len(data), self.model.config.hidden_size))
        for rows in passes([len(ids) for ids in data], self.max_batch_tokens):
            padded = self.tokenizer.pad({"input_ids": [data[i] for i in rows]},
                                        return_tensors="pt")
            encoded: dict[str, torch.Tensor] = {
                key: tensor.to(self.device) for key, tensor in padded.items()}
            vectors[rows] = self.embed(encoded).float().cpu()
        return vectors

    def embed(self, encoded: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.inference_mode():
            tokens = self.model(**encoded).last_hidden_state
            if self.pooling == "cls":
                pooled = tokens[:, 0]
            else:
                mask = encoded["attention_mask"].unsqueeze(-1).to(tokens.dtype)
                pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return F.normalize(pooled, p=2, dim=1) if self.normalize else pooled

    def postprocess(self, data: torch.Tensor) -> list[Any]:
        rows = data.tolist()
        return [
            self._embedding(rows[slot], self._tokens[slot]) if isinstance(slot, int)
            else RequestError(400, slot) for slot in self._slots
        ]

    @staticmethod
    def _embedding(row: list[float], tokens: int) -> Embedding:
        vector = Embedding(row)
        vector.prompt_tokens = tokens
        return vector


def device_for(context: Any) -> torch.device:
    """The worker's GPU (``gpu_id``) when there is one, else the CPU."""
    gpu_id = context.system_properties.get("gpu_id")
    if torch.cuda.is_available() and gpu_id is not None:
        return torch.device(f"cuda:{gpu_id}")
    return torch.device("cpu")


def max_batch_tokens(handler_config: dict[str, Any], max_length: int) -> int:
    """model-config.yaml ``handler.max_batch_tokens``: the padded tokens of one pass.

    :raises ValueError: fewer than ``max_length``, so that one input would not fit a pass.
    """
    tokens = int(handler_config.get("max_batch_tokens", DEFAULT_MAX_BATCH_TOKENS))
    if tokens < max_length:
        raise ValueError(f"handler.max_batch_tokens ({tokens}) must be at least "
                         f"handler.max_length ({max_length}): one input must fit in a pass.")
    return tokens


def passes(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """The indices of ``lengths`` in groups run together: by length, longest first; a text
    joins a group while the group still fits in ``max_tokens`` once padded to its longest and
    that longest is at most about twice the text's own length (so padding at most doubles a
    text's cost); one text at the least."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    groups: list[list[int]] = []
    for index in order:
        if groups:
            longest = lengths[groups[-1][0]]
            if (longest * (len(groups[-1]) + 1) <= max_tokens
                    and longest <= 2 * lengths[index] + PADDING_SLACK):
                groups[-1].append(index)
                continue
        groups.append([index])
    return groups


def _sentence_transformers_settings(model_dir: str) -> dict[str, Any]:
    """Pooling, normalisation and length as a sentence-transformers folder declares them;
    mean pooling, normalised, 512 tokens when it declares nothing."""
    folder = Path(model_dir)
    found: dict[str, Any] = {"pooling": "mean", "normalize": True,
                             "max_length": DEFAULT_MAX_LENGTH}
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        found["normalize"] = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
        for module in modules:
            if str(module.get("type", "")).endswith("Pooling"):
                pooling = json.loads((folder / module["path"] / "config.json").read_text())
                if pooling.get("pooling_mode_cls_token"):
                    found["pooling"] = "cls"
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        pass  # not a sentence-transformers folder, or one we do not read: the defaults
    try:
        bert = json.loads((folder / "sentence_bert_config.json").read_text(encoding="utf-8"))
        found["max_length"] = int(bert["max_seq_length"])
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return found


def _text_of(request: dict[str, Any]) -> tuple[str | None, str]:
    """The text of one request, or None and why there is none."""
    value = request.get("body")
    if value is None:
        value = request.get("data")
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None, 'the body is not UTF-8 text; send text or JSON {"text": "..."}'
        stripped = value.strip()
        if stripped.startswith(("{", '"')):
            try:
                value = json.loads(stripped)
            except RecursionError:
                return None, "the JSON body is nested too deeply to parse"
            except ValueError:
                pass
    if isinstance(value, dict):
        if "text" not in value:
            return None, f"the JSON object has no 'text' key (keys: {sorted(value)!r:.80})"
        value = value["text"]
    if not isinstance(value, str):
        return None, (
            f'expected a text, a JSON string or JSON {{"text": "..."}}, got {type(value).__name__}'
        )
    if not value.strip():
        return None, "the text is empty; send a sentence to embed"
    return value, ""
