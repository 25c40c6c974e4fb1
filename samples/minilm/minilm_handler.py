"""Sentence embeddings with all-MiniLM-L6-v2: one text in, 384 unit-norm floats out.

The archive carries the model's own files (weights, config, tokenizer), so ``initialize`` loads
them from ``model_dir`` with ``local_files_only`` and never touches the network. A batch is
tokenised with padding, run once, mean-pooled over the attention mask and L2-normalised:
what sentence-transformers does for this model.

Input per request: a text body (``str`` or bytes), a JSON string, or JSON ``{"text": "..."}``.
A request without usable text fails alone with 400.
"""

from __future__ import annotations

import json
import os
from typing import Any

# Must be set before transformers/huggingface_hub are imported: they read it once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer
from transformers.utils import logging as transformers_logging

from handlers import BaseHandler, RequestError

DEFAULT_MAX_LENGTH = 256


class MiniLMHandler(BaseHandler):
    def initialize(self, context: Any) -> None:
        properties = context.system_properties
        model_dir = properties.get("model_dir")
        gpu_id = properties.get("gpu_id")
        if torch.cuda.is_available() and gpu_id is not None:
            self.device = torch.device(f"cuda:{gpu_id}")
        else:
            self.device = torch.device("cpu")
        handler_config = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        self.max_length = int(handler_config.get("max_length", DEFAULT_MAX_LENGTH))
        # A progress bar per worker start is noise in the worker log.
        transformers_logging.disable_progress_bar()
        self.context = context
        self.manifest = context.manifest
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.model = AutoModel.from_pretrained(model_dir, local_files_only=True)
        self.model.to(self.device).eval()
        self.initialized = True

    def preprocess(self, data: list[dict[str, Any]]) -> dict[str, Any]:
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
            return {}
        encoded = self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        return {key: tensor.to(self.device) for key, tensor in encoded.items()}

    def inference(self, data: dict[str, Any], *args: Any, **kwargs: Any) -> torch.Tensor:
        if not data:
            return torch.empty((0, self.model.config.hidden_size))
        with torch.inference_mode():
            tokens = self.model(**data).last_hidden_state
            mask = data["attention_mask"].unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return F.normalize(pooled, p=2, dim=1)

    def postprocess(self, data: torch.Tensor) -> list[Any]:
        rows = data.cpu().tolist()
        return [
            rows[slot] if isinstance(slot, int) else RequestError(400, slot) for slot in self._slots
        ]


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
