"""The object_detector built-in on real images and a real (randomly initialised) Faster R-CNN."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

from handlers.context import Context
from handlers.errors import RequestError
from handlers.object_detector import ObjectDetector

torch.set_num_threads(1)

MODEL_PY = """
import torch
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn


class Detector(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = fasterrcnn_mobilenet_v3_large_320_fpn(
            weights=None, weights_backbone=None, num_classes=3
        )

    def forward(self, images):
        return self.net(images)
"""


def image_bytes(size: tuple[int, int], fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image = Image.new("RGB", size, "white")
    image.paste((200, 30, 30), (size[0] // 4, size[1] // 4, size[0] // 2, size[1] // 2))
    image.save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("detector")
    (model_dir / "det_model.py").write_text(MODEL_PY)
    (model_dir / "index_to_name.json").write_text(
        json.dumps({"object_type_names": ["background", "cat", "dog"]})
    )
    torch.manual_seed(0)
    net = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=3)
    torch.save({f"net.{k}": v for k, v in net.state_dict().items()}, model_dir / "weights.pth")
    return model_dir


@pytest.fixture(scope="module")
def detector(model_dir: Path) -> ObjectDetector:
    manifest = {"model": {"serializedFile": "weights.pth", "modelFile": "det_model.py"}}
    handler = ObjectDetector()
    handler.initialize(Context("det", str(model_dir), manifest, 4, None, "0.1.0"))
    # Random weights score low; a zero threshold makes every detection visible.
    handler.threshold = 0.0
    return handler


def context(n: int) -> Context:
    ctx = Context("det", "/unused", {}, n, None, "0.1.0")
    ctx.begin_batch([str(i) for i in range(n)], [{}] * n)
    return ctx


def test_object_detector_batch_of_different_sizes_gives_boxes_per_image(
    detector: ObjectDetector,
) -> None:
    outputs = detector.handle(
        [{"data": image_bytes((120, 90))}, {"data": image_bytes((64, 128), "JPEG")}], context(2)
    )
    assert len(outputs) == 2
    for detections in outputs:
        assert isinstance(detections, list)
        for det in detections:
            [(label, box)] = [(k, v) for k, v in det.items() if k != "score"]
            assert label in ("cat", "dog")
            assert len(box) == 4 and box[0] <= box[2] and box[1] <= box[3]
            assert 0.0 <= det["score"] <= 1.0
    assert sum(len(d) for d in outputs) > 0


def test_object_detector_bad_image_fails_only_its_request(detector: ObjectDetector) -> None:
    outputs = detector.handle(
        [{"data": b"GIF89a-garbage"}, {"data": image_bytes((100, 100))}], context(2)
    )
    assert isinstance(outputs[0], RequestError) and outputs[0].status == 400
    assert isinstance(outputs[1], list)


def test_object_detector_threshold_filters_detections() -> None:
    handler = ObjectDetector()
    handler.mapping = {"1": "cat"}
    row = {
        "boxes": torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]),
        "labels": torch.tensor([1, 2]),
        "scores": torch.tensor([0.9, 0.3]),
    }
    assert handler.postprocess([row]) == [
        [{"cat": [1.0, 2.0, 3.0, 4.0], "score": pytest.approx(0.9)}]
    ]
