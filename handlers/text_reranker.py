"""The built-in ``text_reranker`` handler: a cross-encoder scores how well a document answers a
query.

It serves a transformers sequence classifier with one label (``...ForSequenceClassification``,
``num_labels`` 1: a cross-encoder such as ms-marco-MiniLM or bge-reranker) whose files
(config, weights, tokenizer) are in the model directory: an archive's, or a model folder served
as it is (``mservd/controller/model_folder.py`` picks this handler for such a folder).
``initialize`` loads them with ``local_files_only`` and never touches the network.

One request (a row) is one pair, JSON ``{"query": "...", "document": "..."}`` (the rerank
endpoints, ``/v1/rerank`` and ``/v2/rerank``, make one row per document: ``mservd/worker/codecs/
rerank.py``). Its answer is the pair's relevance score: the model's one logit through a sigmoid
(what sentence-transformers' ``CrossEncoder`` and vLLM answer for a one-label model), a number
from 0 to 1; model-config.yaml ``handler: {activation: none}`` answers the logit itself. The
score also says how many tokens its pair ran as (``Score.prompt_tokens``, the rerank answer's
usage). A pair is tokenised as the model was trained, query then document, truncated (longest
first) to ``max_length`` (model-config.yaml ``handler:``; default the tokenizer's own length, at
most 512); the pairs of a batch run in passes of similar length under ``max_batch_tokens``
padded tokens (default 8192), as ``text_embedder``'s texts do.
"""

from __future__ import annotations

import json
import os
from typing import Any

# Must be set before transformers/huggingface_hub are imported: they read it once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from transformers.utils import logging as transformers_logging

from handlers import BaseHandler, RequestError
from handlers.text_embedder import DEFAULT_MAX_LENGTH, device_for, max_batch_tokens, passes

ACTIVATIONS = ("sigmoid", "none")


class Score(float):
    """A pair's relevance score (a number, as every protocol answers it), with the number of
    tokens the pair ran as (special tokens included, after truncation)."""

    prompt_tokens: int = 0


class TextReranker(BaseHandler):
    def initialize(self, context: Any) -> None:
        model_dir = context.system_properties.get("model_dir")
        self.device = device_for(context)
        config = (getattr(context, "model_yaml_config", None) or {}).get("handler") or {}
        transformers_logging.disable_progress_bar()
        self.context = context
        self.manifest = context.manifest
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, local_files_only=True)
        self.model.to(self.device).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(f"A reranker has one label (a relevance logit); this model has "
                             f"{self.model.config.num_labels}. Serve a classifier with "
                             "text_classifier.")
        own = self.tokenizer.model_max_length
        self.max_length = int(config.get("max_length", min(
            own if isinstance(own, int) and own > 0 else DEFAULT_MAX_LENGTH,
            DEFAULT_MAX_LENGTH)))
        self.max_batch_tokens = max_batch_tokens(config, self.max_length)
        self.activation = str(config.get("activation", "sigmoid"))
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"handler.activation must be one of {ACTIVATIONS}, got "
                             f"{self.activation!r}")
        self.initialized = True

    def preprocess(self, data: list[dict[str, Any]]) -> list[dict[str, list[int]]]:
        """Each usable pair's tokens (query then document, truncated, no padding)."""
        queries: list[str] = []
        documents: list[str] = []
        # Per batch: the row of each request in the tensors, or why it has none.
        self._slots: list[int | str] = []
        for request in data:
            pair, problem = _pair_of(request)
            if pair is None:
                self._slots.append(problem)
            else:
                self._slots.append(len(queries))
                queries.append(pair[0])
                documents.append(pair[1])
        if not queries:
            self._tokens: list[int] = []
            return []
        encoded = self.tokenizer(queries, documents, truncation=True,
                                 max_length=self.max_length)
        rows = [{key: encoded[key][i] for key in encoded} for i in range(len(queries))]
        self._tokens = [len(row["input_ids"]) for row in rows]
        return rows

    def inference(self, data: list[dict[str, list[int]]], *args: Any,
                  **kwargs: Any) -> torch.Tensor:
        """One score per pair, from passes over pairs of similar length."""
        scores = torch.empty(len(data))
        for rows in passes([len(row["input_ids"]) for row in data], self.max_batch_tokens):
            padded = self.tokenizer.pad([data[i] for i in rows], return_tensors="pt")
            with torch.inference_mode():
                logits = self.model(**{k: v.to(self.device) for k, v in padded.items()}).logits
            scores[rows] = logits[:, 0].float().cpu()
        return torch.sigmoid(scores) if self.activation == "sigmoid" else scores

    def postprocess(self, data: torch.Tensor) -> list[Any]:
        values = data.tolist()
        return [self._score(values[slot], self._tokens[slot]) if isinstance(slot, int)
                else RequestError(400, slot) for slot in self._slots]

    @staticmethod
    def _score(value: float, tokens: int) -> Score:
        score = Score(value)
        score.prompt_tokens = tokens
        return score


def _pair_of(request: dict[str, Any]) -> tuple[tuple[str, str] | None, str]:
    """The (query, document) of one request, or None and why there is none."""
    value = request.get("body")
    if value is None:
        value = request.get("data")
    if isinstance(value, (bytes, bytearray)):
        try:
            value = json.loads(bytes(value).decode("utf-8"))
        except RecursionError:
            return None, "the JSON body is nested too deeply to parse"
        except (UnicodeDecodeError, ValueError):
            return None, 'the body is not JSON {"query": "...", "document": "..."}'
    if not isinstance(value, dict):
        return None, (f'expected JSON {{"query": "...", "document": "..."}}, got '
                      f"{type(value).__name__}")
    query, document = value.get("query"), value.get("document")
    if not isinstance(query, str) or not isinstance(document, str):
        return None, ('expected JSON {"query": "...", "document": "..."}, both strings '
                      f"(keys: {sorted(value)!r:.80})")
    if not query.strip():
        return None, "the query is empty"
    return (query, document), ""
