"""``TextClassifier``: the ``text_classifier`` built-in — ``{label: probability}`` over all classes."""

from __future__ import annotations

import logging
from typing import Any

import torch.nn.functional as F

from handlers.labels import map_class_to_label
from handlers.text_handler import TextHandler

logger = logging.getLogger(__name__)


class TextClassifier(TextHandler):
    """The model returns one row of logits per text."""

    def postprocess(self, data: Any) -> list[dict[str, float]]:
        return map_class_to_label(F.softmax(data.float(), dim=1).tolist(), self.mapping)
