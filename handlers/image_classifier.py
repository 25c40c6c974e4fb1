"""``ImageClassifier``: the ``image_classifier`` built-in — top-k ``{label: probability}`` per image."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from handlers import image_transforms as transforms
from handlers.labels import map_class_to_label
from handlers.vision_handler import VisionHandler

logger = logging.getLogger(__name__)


class ImageClassifier(VisionHandler):
    """ImageNet-style preprocessing; the model returns one row of logits per image.

    :attr topk: how many classes each response lists, most probable first.
    """

    topk = 5
    image_processing = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )

    def set_max_result_classes(self, topk: int) -> None:
        self.topk = topk

    def get_max_result_classes(self) -> int:
        return self.topk

    def postprocess(self, data: Any) -> list[dict[str, float]]:
        probs = F.softmax(data.float(), dim=1)
        top_probs, top_classes = torch.topk(probs, min(self.topk, probs.shape[1]), dim=1)
        return map_class_to_label(top_probs.tolist(), self.mapping, top_classes.tolist())
