"""``ObjectDetector``: the ``object_detector`` built-in — boxes, labels and scores per image.

For torchvision detection models, which take a list of ``[3, H, W]`` tensors (any sizes) and
return one ``{"boxes", "labels", "scores"}`` dict per image. Each response is a list of
``{label: [x1, y1, x2, y2], "score": s}`` for the detections scoring at least :attr:`threshold`.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

import torch

from handlers import image_transforms as transforms
from handlers.labels import label_for
from handlers.vision_handler import VisionHandler

logger = logging.getLogger(__name__)


class ObjectDetector(VisionHandler):
    """:attr threshold: the lowest score a detection needs to be returned."""

    threshold = 0.5
    image_processing = transforms.ToTensor()

    def group_key(self, value: Any) -> Hashable:
        # The model takes images of different sizes in one call.
        return None

    def collate(self, values: list[Any]) -> list[torch.Tensor]:
        return list(values)

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        detections = super().inference(data, *args, **kwargs)
        # A scripted torchvision detector returns (losses, detections).
        if isinstance(detections, tuple) and len(detections) == 2:
            detections = detections[1]
        return detections

    def postprocess(self, data: Any) -> list[list[dict[str, Any]]]:
        results = []
        for row in data:
            keep = row["scores"] >= self.threshold
            boxes = row["boxes"][keep].tolist()
            labels = row["labels"][keep].tolist()
            scores = row["scores"][keep].tolist()
            results.append(
                [
                    {label_for(int(label), self.mapping): box, "score": score}
                    for label, box, score in zip(labels, boxes, scores)
                ]
            )
        return results
