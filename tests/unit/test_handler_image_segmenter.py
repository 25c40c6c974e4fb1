"""The image_segmenter built-in on real images and a real (randomly initialised) LR-ASPP."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision import transforms
from torchvision.models.segmentation import lraspp_mobilenet_v3_large

from handlers.context import Context
from handlers.errors import RequestError
from handlers.image_segmenter import ImageSegmenter

torch.set_num_threads(1)

NUM_CLASSES = 3
SIZE = 64

MODEL_PY = """
import torch
from torchvision.models.segmentation import lraspp_mobilenet_v3_large


class Segmenter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3)

    def forward(self, x):
        return self.net(x)
"""


class SmallSegmenter(ImageSegmenter):
    image_processing = transforms.Compose(
        [transforms.Resize(SIZE), transforms.CenterCrop(SIZE), transforms.ToTensor()]
    )


def image_bytes(size: tuple[int, int], fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, "purple").save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("segmenter")
    (model_dir / "seg_model.py").write_text(MODEL_PY)
    torch.manual_seed(0)
    net = lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=NUM_CLASSES)
    state = {f"net.{k}": v for k, v in net.state_dict().items()}
    torch.save(state, model_dir / "weights.pth")
    return model_dir


def load(
    model_dir: Path, n: int, handler: ImageSegmenter | None = None
) -> tuple[ImageSegmenter, Context]:
    manifest = {"model": {"serializedFile": "weights.pth", "modelFile": "seg_model.py"}}
    ctx = Context("seg", str(model_dir), manifest, n, None, "0.1.0")
    ctx.begin_batch([str(i) for i in range(n)], [{}] * n)
    handler = handler or SmallSegmenter()
    handler.initialize(ctx)
    return handler, ctx


def test_image_segmenter_batch_gives_class_and_probability_per_pixel(model_dir: Path) -> None:
    handler, ctx = load(model_dir, 2)
    outputs = handler.handle(
        [{"data": image_bytes((80, 64))}, {"body": image_bytes((64, 90), "JPEG")}], ctx
    )
    assert len(outputs) == 2
    for mask in outputs:
        assert len(mask) == SIZE and len(mask[0]) == SIZE
        cls, prob = mask[5][7]
        assert cls in (0.0, 1.0, 2.0)
        assert 1 / NUM_CLASSES <= prob <= 1.0


def test_image_segmenter_bad_image_fails_only_its_request(model_dir: Path) -> None:
    handler, ctx = load(model_dir, 3)
    outputs = handler.handle(
        [
            {"data": image_bytes((70, 70))},
            {"data": b"\x89PNG\r\n\x1a\nbroken"},
            {"data": image_bytes((64, 64))},
        ],
        ctx,
    )
    assert isinstance(outputs[1], RequestError) and outputs[1].status == 400
    assert len(outputs[0]) == SIZE and len(outputs[2]) == SIZE


def test_image_segmenter_runs_different_sizes_in_one_batch(model_dir: Path) -> None:
    class NoCrop(ImageSegmenter):
        image_processing = transforms.ToTensor()

    handler, ctx = load(model_dir, 2, NoCrop())
    outputs = handler.handle(
        [{"data": image_bytes((48, 32))}, {"data": image_bytes((40, 56))}], ctx
    )
    assert (len(outputs[0]), len(outputs[0][0])) == (32, 48)
    assert (len(outputs[1]), len(outputs[1][0])) == (56, 40)


def test_image_segmenter_accepts_a_bare_tensor_output() -> None:
    handler = ImageSegmenter()
    logits = torch.zeros(2, 3, 4, 5)
    logits[:, 2] = 5.0
    out = handler.postprocess(logits)
    assert len(out) == 2 and len(out[0]) == 4 and len(out[0][0]) == 5
    assert out[1][3][4][0] == 2.0
