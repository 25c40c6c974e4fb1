"""Each sample archive gives its real answer through the running daemon."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIGIT_IMAGES = sorted((REPO / "samples" / "digits" / "images").glob("*.png"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    workdir = tmp_path_factory.mktemp("samples-daemon")
    daemon = Daemon(workdir, store, {"load_models": "tiny.mar,digits.mar,resnet18.mar,minilm.mar",
                                     "batch_size": 4, "max_batch_delay": 20})
    daemon.start()
    yield daemon
    daemon.stop()


def test_all_start_up_models_are_loaded(daemon) -> None:
    assert daemon.state["failed"] == {}
    assert sorted(daemon.state["models"]) == ["digits", "minilm", "resnet18", "tiny"]
    assert daemon.session.get(daemon.url("inference", "/ping")).json() == {"status": "Healthy"}


@pytest.mark.parametrize("image", DIGIT_IMAGES, ids=lambda p: p.name)
def test_digits_classifies_its_sample_image(daemon, image: Path) -> None:
    answer = daemon.predict("digits", data=image.read_bytes(),
                            headers={"Content-Type": "image/png"})
    assert answer.status_code == 200, answer.text
    scores = answer.json()
    best = max(scores, key=scores.get)
    assert best == image.name.split("_")[0]


def test_digits_accepts_a_multipart_upload(daemon) -> None:
    image = DIGIT_IMAGES[0]
    answer = daemon.predict("digits", files={"data": (image.name, image.read_bytes(), "image/png")})
    assert answer.status_code == 200, answer.text
    assert max(answer.json(), key=answer.json().get) == image.name.split("_")[0]


def test_minilm_puts_a_paraphrase_closer_than_an_unrelated_sentence(daemon) -> None:
    def embed(text: str) -> list[float]:
        answer = daemon.predict("minilm", data=text.encode(),
                                headers={"Content-Type": "text/plain"})
        assert answer.status_code == 200, answer.text
        return answer.json()

    a = embed("The cat sits on the mat.")
    b = embed("A cat is sitting on a rug.")
    c = embed("Quarterly revenue grew by four percent.")
    assert len(a) == 384
    assert math.isclose(sum(x * x for x in a), 1.0, rel_tol=1e-4)
    cos = lambda u, v: sum(x * y for x, y in zip(u, v))  # noqa: E731 - unit vectors
    assert cos(a, b) > cos(a, c) + 0.2


def test_resnet18_returns_top5_labels(daemon) -> None:
    image = DIGIT_IMAGES[0]
    answer = daemon.predict("resnet18", data=image.read_bytes(),
                            headers={"Content-Type": "image/png"})
    assert answer.status_code == 200, answer.text
    scores = answer.json()
    assert len(scores) == 5 and all(k.startswith("class_") for k in scores)
    assert all(0.0 <= v <= 1.0 for v in scores.values())


def test_tiny_returns_ten_numbers_and_refuses_a_wrong_shape(daemon) -> None:
    good = daemon.predict("tiny", json=[0.1] * 64)
    assert good.status_code == 200 and len(good.json()) == 10
    bad = daemon.predict("tiny", json=[0.1] * 3)
    assert bad.status_code == 400
    assert "expected a JSON list of 64 numbers" in bad.json()["message"]
