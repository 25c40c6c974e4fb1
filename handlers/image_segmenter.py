"""``ImageSegmenter``: the ``image_segmenter`` built-in — per pixel, the top class and its probability.

The output per image is TorchServe's: a ``[H][W][2]`` nested list of ``[class_index, probability]``
(the top class only, because all classes for every pixel makes responses of tens of megabytes).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from handlers import image_transforms as transforms
from handlers.vision_handler import VisionHandler

logger = logging.getLogger(__name__)


class ImageSegmenter(VisionHandler):
    """For models returning ``[N, K, H, W]`` logits, bare or as ``{"out": ...}`` (torchvision)."""

    image_processing = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )

    def postprocess(self, data: Any) -> list[Any]:
        logits = data["out"] if isinstance(data, dict) else data
        best = torch.max(torch.softmax(logits.float(), dim=1), dim=1)
        pairs = torch.stack([best.indices.to(best.values.dtype), best.values], dim=3)
        return pairs.tolist()
