"""The sample archives build from ``samples/`` and serve correct answers through the real handler
code path: unpack, ``load_handler``, ``initialize``, one ``handle`` per batch."""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from sample_archives import load_build_all

import archiver
import handlers

REPO = Path(__file__).resolve().parents[2]
DIGIT_IMAGES = sorted((REPO / "samples" / "digits" / "images").glob("*.png"))


build_all = load_build_all()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Shared by name with test_run_handler.py: build_samples skips archives already built there.
    return tmp_path_factory.getbasetemp() / "sample-archives"


class Served:
    """One archive unpacked and its handler initialized, as a worker does."""

    def __init__(self, archive: Path) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="served-")
        model_dir = Path(self._tmp.name) / "model"
        manifest = archiver.unpack(archive, model_dir)
        self.context = handlers.Context(
            model_name=manifest.model_name,
            model_dir=str(model_dir),
            manifest=manifest.to_dict(),
            batch_size=8,
            gpu=0 if torch.cuda.is_available() else None,
            mms_version="test",
        )
        self.handler = handlers.load_handler(str(model_dir), manifest.handler)
        self.handler.initialize(self.context)

    def batch(self, bodies: list[Any]) -> list[Any]:
        self.context.begin_batch([f"req-{i}" for i in range(len(bodies))], [{} for _ in bodies])
        return self.handler.handle([{"body": body, "data": body} for body in bodies], self.context)

    def close(self) -> None:
        self._tmp.cleanup()


@pytest.fixture(scope="module")
def serve(store: Path):
    served: dict[str, Served] = {}

    def get(name: str) -> Served:
        if name not in served:
            archive = build_all.build_samples(store, [name])[name]
            served[name] = Served(archive)
        return served[name]

    yield get
    for one in served.values():
        one.close()


def _rgb_image(fmt: str, seed: int) -> bytearray:
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (240, 320, 3), dtype=torch.uint8, generator=generator)
    buffer = io.BytesIO()
    Image.fromarray(pixels.numpy(), mode="RGB").save(buffer, format=fmt)
    return bytearray(buffer.getvalue())


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


# --- digits ------------------------------------------------------------------------------


def test_digits_committed_images_have_labels_in_their_names() -> None:
    assert len(DIGIT_IMAGES) >= 5
    assert len({path.name.split("_")[0] for path in DIGIT_IMAGES}) >= 5


def test_digits_classifies_every_committed_image(serve) -> None:
    digits = serve("digits")
    outputs = digits.batch([bytearray(path.read_bytes()) for path in DIGIT_IMAGES])
    assert len(outputs) == len(DIGIT_IMAGES)
    for path, output in zip(DIGIT_IMAGES, outputs, strict=True):
        assert isinstance(output, dict) and len(output) == 5, output
        best = max(output, key=output.get)
        assert best == path.name.split("_")[0], f"{path.name} classified as {best}: {output}"


def test_digits_accepts_an_upscaled_rgb_image(serve) -> None:
    path = DIGIT_IMAGES[0]
    big = Image.open(path).convert("RGB").resize((64, 64), Image.NEAREST)
    buffer = io.BytesIO()
    big.save(buffer, format="PNG")
    (output,) = serve("digits").batch([bytearray(buffer.getvalue())])
    assert max(output, key=output.get) == path.name.split("_")[0]


# --- minilm ------------------------------------------------------------------------------


def test_minilm_puts_a_paraphrase_closer_than_an_unrelated_sentence(serve) -> None:
    outputs = serve("minilm").batch(
        [
            "A man is playing a guitar.",
            {"text": "Someone is strumming a guitar."},
            bytearray(b"The central bank raised interest rates again."),
        ]
    )
    assert len(outputs) == 3
    for vector in outputs:
        assert isinstance(vector, list) and len(vector) == 384
        assert all(isinstance(x, float) for x in vector)
        assert math.isclose(math.sqrt(_cosine(vector, vector)), 1.0, abs_tol=1e-4)
    anchor, paraphrase, unrelated = outputs
    assert _cosine(anchor, paraphrase) > _cosine(anchor, unrelated) + 0.3


def test_minilm_embedding_does_not_depend_on_the_batch(serve) -> None:
    minilm = serve("minilm")
    (alone,) = minilm.batch(["short"])
    _, padded = minilm.batch(
        ["a much longer sentence that forces padding of the short one", "short"]
    )
    assert max(abs(a - b) for a, b in zip(alone, padded, strict=True)) < 1e-4


def test_minilm_request_without_text_fails_alone(serve) -> None:
    outputs = serve("minilm").batch(["hello", "   ", {"title": "x"}, 42, bytearray(b"\xff\xfe")])
    assert len(outputs[0]) == 384
    for error in outputs[1:]:
        assert isinstance(error, handlers.RequestError) and error.status == 400, error
    assert "empty" in outputs[1].message
    assert "'text'" in outputs[2].message


# --- resnet18 ----------------------------------------------------------------------------


def test_resnet18_gives_top5_per_image(serve) -> None:
    outputs = serve("resnet18").batch([_rgb_image("JPEG", 1), _rgb_image("PNG", 2)])
    assert len(outputs) == 2
    for output in outputs:
        assert isinstance(output, dict) and len(output) == 5
        assert all(label.startswith("class_") for label in output)
        assert list(output.values()) == sorted(output.values(), reverse=True)


# --- tiny --------------------------------------------------------------------------------


def test_tiny_gives_ten_floats_per_request(serve) -> None:
    outputs = serve("tiny").batch([[0.0] * 64, [float(i) for i in range(64)], [1] * 64])
    assert len(outputs) == 3
    for output in outputs:
        assert isinstance(output, list) and len(output) == 10
        assert all(isinstance(x, float) for x in output)
    assert outputs[0] != outputs[1]


def test_tiny_wrong_shape_request_fails_alone(serve) -> None:
    good = [0.5] * 64
    outputs = serve("tiny").batch([good, [1, 2, 3], good, "nope", [True] * 64])
    assert len(outputs[0]) == 10 and outputs[2] == outputs[0]
    for idx, got in ((1, "a list of 3 items"), (3, "str 'nope'"), (4, "a list containing bool")):
        error = outputs[idx]
        assert isinstance(error, handlers.RequestError) and error.status == 400
        assert error.message.startswith("expected a JSON list of 64 numbers, got ")
        assert got in error.message


def test_tiny_numbers_no_float32_holds_fail_alone(serve) -> None:
    good = [0.5] * 64
    huge = [0.5] * 63 + [10**400]  # JSON parses it; torch.tensor raised for the whole batch
    bodies = [huge, good, [float("nan")] * 64, json.loads("[" + ", ".join(["1e400"] * 64) + "]"),
              [0.5] * 63 + [-(2**200)]]
    outputs = serve("tiny").batch(bodies)
    assert len(outputs[1]) == 10
    for idx, got in ((0, "1000000000000000"), (2, "nan"), (3, "inf"), (4, "-16069")):
        error = outputs[idx]
        assert isinstance(error, handlers.RequestError) and error.status == 400
        assert got in error.message and "not a finite 32-bit float" in error.message


def test_tiny_accepts_a_raw_json_body(serve) -> None:
    (output,) = serve("tiny").batch([bytearray(json.dumps([0.1] * 64).encode())])
    assert len(output) == 10


def test_tiny_names_a_body_that_is_not_json_as_such(serve) -> None:
    (error,) = serve("tiny").batch([bytearray(b'{"data": [1,2')])
    assert isinstance(error, handlers.RequestError) and error.status == 400
    assert error.message.startswith("expected a JSON list of 64 numbers, got a body that is "
                                    "not JSON (Expecting"), error.message
    assert "bytearray" not in error.message


# --- build_all ---------------------------------------------------------------------------


def test_build_all_skips_an_up_to_date_archive(tmp_path: Path) -> None:
    first = build_all.build_samples(tmp_path, ["tiny"])["tiny"]
    built = first.stat().st_mtime_ns
    again = build_all.build_samples(tmp_path, ["tiny"])["tiny"]
    assert again == first and again.stat().st_mtime_ns == built
    os.utime(first, ns=(0, 0))  # older than its sources, as after editing one
    build_all.build_samples(tmp_path, ["tiny"])
    assert first.stat().st_mtime_ns >= built


def test_build_all_rejects_an_unknown_sample(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unknown sample 'nope'"):
        build_all.build_samples(tmp_path, ["nope"])
