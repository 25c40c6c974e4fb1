"""The image_classifier built-in on real images and a real (randomly initialised) ResNet-18."""

from __future__ import annotations

import base64
import io
import json
import textwrap
from pathlib import Path

import pytest
import torch
import torchvision
from PIL import Image

from handlers.context import Context
from handlers.errors import RequestError
from handlers.image_classifier import ImageClassifier

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")

NUM_CLASSES = 10
LABELS = {str(i): f"class-{i}" for i in range(NUM_CLASSES)}

MODEL_PY = textwrap.dedent(
    """
    import torchvision
    from torchvision.models import ResNet


    class Classifier(ResNet):
        def __init__(self):
            super().__init__(torchvision.models.resnet.BasicBlock, [2, 2, 2, 2], num_classes=10)
    """
)


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (64, 48), color: str = "red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def make_context(model_dir: Path, manifest_model: dict[str, str], n: int) -> Context:
    ctx = Context("resnet", str(model_dir), {"model": manifest_model}, n, None, "0.1.0")
    ctx.begin_batch([f"req-{i}" for i in range(n)], [{} for _ in range(n)])
    return ctx


@pytest.fixture(scope="module")
def scripted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("scripted")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=NUM_CLASSES).eval()
    torch.jit.script(model).save(str(model_dir / "model.pt"))
    (model_dir / "index_to_name.json").write_text(json.dumps(LABELS))
    return model_dir


@pytest.fixture(scope="module")
def eager_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("eager")
    (model_dir / "resnet_model.py").write_text(MODEL_PY)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=NUM_CLASSES)
    torch.save(model.state_dict(), model_dir / "weights.pth")
    return model_dir


def scripted_handler(model_dir: Path, n: int) -> tuple[ImageClassifier, Context]:
    ctx = make_context(model_dir, {"serializedFile": "model.pt"}, n)
    handler = ImageClassifier()
    handler.initialize(ctx)
    return handler, ctx


def test_image_classifier_batch_gives_topk_labels_in_order(scripted_dir: Path) -> None:
    handler, ctx = scripted_handler(scripted_dir, 3)
    images = [
        image_bytes("PNG", color="red"),
        image_bytes("JPEG", color="blue"),
        image_bytes("PNG", (300, 200), "green"),
    ]
    outputs = handler.handle([{"data": bytearray(b)} for b in images], ctx)

    assert len(outputs) == 3
    for out in outputs:
        assert len(out) == 5
        assert set(out) <= set(LABELS.values())
        probs = list(out.values())
        assert probs == sorted(probs, reverse=True)
    # Each output belongs to its own image: the same image alone gives the same answer.
    alone = handler.handle([{"data": images[1]}], make_context(scripted_dir, {}, 1))
    assert alone[0] == pytest.approx(outputs[1])


def test_image_classifier_bad_image_fails_only_its_request(scripted_dir: Path) -> None:
    handler, ctx = scripted_handler(scripted_dir, 4)
    data = [
        {"data": bytearray(image_bytes())},
        {"data": bytearray(b"this is not an image")},
        {"body": base64.b64encode(image_bytes("JPEG")).decode()},
        {"body": {"not": "an image"}},
    ]
    outputs = handler.handle(data, ctx)

    assert len(outputs) == 4
    assert isinstance(outputs[0], dict) and len(outputs[0]) == 5
    assert isinstance(outputs[2], dict) and len(outputs[2]) == 5
    assert isinstance(outputs[1], RequestError)
    assert outputs[1].status == 400
    assert "not an image format PIL can read" in outputs[1].message
    assert isinstance(outputs[3], RequestError)
    assert outputs[3].message.startswith("Expected an image")


def test_image_classifier_all_bad_requests_skip_inference(
    scripted_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler, ctx = scripted_handler(scripted_dir, 2)

    def no_inference(*args: object, **kwargs: object) -> None:
        raise AssertionError("inference must not run when every request failed")

    monkeypatch.setattr(handler, "inference", no_inference)
    outputs = handler.handle([{"data": b"x"}, {"nothing": b""}], ctx)
    assert [type(o) for o in outputs] == [RequestError, RequestError]
    assert "no 'data' or 'body' input" in outputs[1].message


def test_image_classifier_runs_inference_once_per_batch(
    scripted_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler, ctx = scripted_handler(scripted_dir, 3)
    shapes: list[tuple[int, ...]] = []
    original = handler.inference

    def counting(data: torch.Tensor, *args: object, **kwargs: object) -> object:
        shapes.append(tuple(data.shape))
        return original(data)

    monkeypatch.setattr(handler, "inference", counting)
    handler.handle([{"data": image_bytes()}, {"data": b"bad"}, {"data": image_bytes("JPEG")}], ctx)
    assert shapes == [(2, 3, 224, 224)]


def test_image_classifier_without_mapping_uses_index_labels(eager_dir: Path) -> None:
    ctx = make_context(
        eager_dir, {"serializedFile": "weights.pth", "modelFile": "resnet_model.py"}, 1
    )
    handler = ImageClassifier()
    handler.initialize(ctx)
    handler.set_max_result_classes(3)
    [out] = handler.handle([{"data": image_bytes()}], ctx)
    assert len(out) == 3
    assert set(out) <= {str(i) for i in range(NUM_CLASSES)}
    assert handler.mapping is None


def test_image_classifier_eager_and_scripted_agree(scripted_dir: Path, eager_dir: Path) -> None:
    scripted, ctx = scripted_handler(scripted_dir, 1)
    eager_ctx = make_context(
        eager_dir, {"serializedFile": "weights.pth", "modelFile": "resnet_model.py"}, 1
    )
    eager = ImageClassifier()
    eager.initialize(eager_ctx)
    assert type(eager.model).__name__ == "Classifier"
    image = image_bytes("PNG", (80, 80), "yellow")
    [a] = scripted.handle([{"data": image}], ctx)
    [b] = eager.handle([{"data": image}], eager_ctx)
    # Same seed, same weights: labels differ only by the mapping.
    assert list(b.values()) == pytest.approx(list(a.values()), abs=1e-5)
    assert [LABELS[k] for k in b] == list(a)


def test_image_classifier_image_processing_is_overridable(scripted_dir: Path) -> None:
    from torchvision import transforms

    class Small(ImageClassifier):
        image_processing = transforms.Compose([transforms.Resize((32, 32)), transforms.ToTensor()])
        topk = 2

    ctx = make_context(scripted_dir, {"serializedFile": "model.pt"}, 2)
    handler = Small()
    handler.initialize(ctx)
    outputs = handler.handle([{"data": image_bytes()}, {"data": image_bytes("JPEG")}], ctx)
    assert [len(o) for o in outputs] == [2, 2]


def test_image_classifier_accepts_grayscale_and_rgba(scripted_dir: Path) -> None:
    handler, ctx = scripted_handler(scripted_dir, 2)
    images = []
    for mode in ("L", "RGBA"):
        buf = io.BytesIO()
        Image.new(mode, (40, 40)).save(buf, format="PNG")
        images.append({"data": buf.getvalue()})
    outputs = handler.handle(images, ctx)
    assert all(isinstance(o, dict) for o in outputs)


def test_a_subclass_with_its_own_transform_gets_the_image_as_sent_as_in_torchserve(
        scripted_dir: Path) -> None:
    """TorchServe's MNIST example: its grayscale transform gets the PNG's one channel (the
    built-ins' RGB conversion gave its 1-channel network 3 and failed every request)."""
    from torchvision import transforms

    class Digits(ImageClassifier):
        image_processing = transforms.Compose([transforms.ToTensor()])

    class DigitsAsRgb(Digits):
        image_mode = "RGB"  # a subclass may still ask for a mode

    buf = io.BytesIO()
    Image.new("L", (28, 28)).save(buf, format="PNG")
    assert Digits().decode_request({"data": buf.getvalue()}).shape == (1, 28, 28)
    assert DigitsAsRgb().decode_request({"data": buf.getvalue()}).shape == (3, 28, 28)
    assert ImageClassifier.image_mode == "RGB"  # the built-in's own transform: 3 channels


def test_image_classifier_records_handler_time(scripted_dir: Path) -> None:
    handler, ctx = scripted_handler(scripted_dir, 1)
    ctx.metrics.drain()
    handler.handle([{"data": image_bytes()}], ctx)
    assert [s.name for s in ctx.metrics.drain()] == ["HandlerTime"]
