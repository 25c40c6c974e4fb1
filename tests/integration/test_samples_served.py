"""Each sample archive gives its real answer through the running daemon."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
DIGIT_IMAGES = sorted((REPO / "samples" / "digits" / "images").glob("*.png"))

#: What each sample's model-config.yaml declares, so tritonclient users can discover it.
V2_TENSORS = {
    "digits": ([{"name": "INPUT0", "datatype": "BYTES", "shape": [1]}],
               [{"name": "output0", "datatype": "BYTES", "shape": [1]}]),
    "minilm": ([{"name": "INPUT0", "datatype": "BYTES", "shape": [1]}],
               [{"name": "output0", "datatype": "FP32", "shape": [1, 384]}]),
    "resnet18": ([{"name": "INPUT0", "datatype": "BYTES", "shape": [1]}],
                 [{"name": "output0", "datatype": "BYTES", "shape": [1]}]),
    "tiny": ([{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64]}],
             [{"name": "output0", "datatype": "FP32", "shape": [1, 10]}]),
}


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
    cos = lambda u, v: sum(x * y for x, y in zip(u, v))  # unit vectors
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


@pytest.mark.parametrize("name", sorted(V2_TENSORS))
def test_sample_declares_its_v2_tensors(daemon, name: str) -> None:
    answer = daemon.session.get(daemon.url("inference", f"/v2/models/{name}"),
                                headers=daemon._headers("inference", None), timeout=30)
    assert answer.status_code == 200, answer.text
    meta = answer.json()
    assert meta["name"] == name and meta["platform"] == "pytorch"
    assert meta["inputs"] and meta["outputs"]
    assert (meta["inputs"], meta["outputs"]) == V2_TENSORS[name]


def _fits(shape: list[int], declared: list[int]) -> bool:
    return len(shape) == len(declared) and all(
        want in (-1, got) for want, got in zip(declared, shape, strict=True))


@pytest.mark.parametrize("name", sorted(V2_TENSORS))
def test_sample_answers_v2_as_its_metadata_declares(daemon, name: str) -> None:
    # A tritonclient user's path: read the metadata, build the input from it, read the output.
    tritonhttp = pytest.importorskip("tritonclient.http")
    auth = daemon._headers("inference", None)
    client = tritonhttp.InferenceServerClient(
        daemon.url("inference", "").removeprefix("http://"), network_timeout=120)
    try:
        meta = client.get_model_metadata(name, headers=auth)
        (spec,) = meta["inputs"]
        image = DIGIT_IMAGES[0]
        value = {
            "digits": np.array([image.read_bytes()], dtype=object),
            "minilm": np.array([b"A man is playing a guitar."], dtype=object),
            "resnet18": np.array([image.read_bytes()], dtype=object),
            "tiny": np.full((1, 64), 0.1, dtype=np.float32),
        }[name]
        assert _fits(list(value.shape), spec["shape"])
        tensor = tritonhttp.InferInput(spec["name"], list(value.shape), spec["datatype"])
        tensor.set_data_from_numpy(value)
        result = client.infer(name, [tensor], headers=auth)
    finally:
        client.close()
    for declared in meta["outputs"]:
        out = result.get_output(declared["name"])
        assert out is not None, result.get_response()
        assert out["datatype"] == declared["datatype"]
        assert _fits(out["shape"], declared["shape"]), (out["shape"], declared["shape"])
    got = result.as_numpy("output0")
    if name == "digits":
        scores = json.loads(got[0])
        assert max(scores, key=scores.get) == image.name.split("_")[0]
    elif name == "resnet18":
        assert len(json.loads(got[0])) == 5
    elif name == "minilm":
        assert math.isclose(float((got[0] ** 2).sum()), 1.0, rel_tol=1e-4)
