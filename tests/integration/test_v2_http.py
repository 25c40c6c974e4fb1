"""The Open Inference Protocol v2 over REST, with the real tritonclient.http as the client."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import requests

tritonhttp = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException

V2_CONFIG = {
    "batchSize": 8, "maxBatchDelay": 1000, "minWorkers": 1, "maxWorkers": 1,
    "v2": {"platform": "pytorch",
           "inputs": [{"name": "NUMBERS", "datatype": "INT64", "shape": [-1]},
                      {"name": "WORDS", "datatype": "BYTES", "shape": [-1]}],
           "outputs": [{"name": "DOUBLED", "datatype": "INT64", "shape": [-1]},
                       {"name": "SHOUTED", "datatype": "BYTES", "shape": [-1]},
                       {"name": "BATCH", "datatype": "INT64", "shape": [1]}]},
}


def v2_archives(store) -> None:
    from conftest import write_archive

    if not (store / "v2typed.mar").exists():
        write_archive(store, "v2typed", "v2_typed.py", config=V2_CONFIG)
        write_archive(store, "v2typed", "v2_typed.py", version="2.0", config=V2_CONFIG)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    v2_archives(store)
    daemon = Daemon(tmp_path_factory.mktemp("v2-http"), store,
                    {"load_models": "tiny.mar,echobatch.mar,v2typed.mar,v2typed-2.0.mar"})
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon):
    url = daemon.state["addresses"]["inference"].removeprefix("http://")
    client = tritonhttp.InferenceServerClient(url, concurrency=8, connection_timeout=60,
                                              network_timeout=60)
    yield client
    client.close()


@pytest.fixture(scope="module")
def auth(daemon):
    return {"Authorization": f"Bearer {daemon.key('inference')}"}


def tiny_input(seed: int = 0) -> list[float]:
    return np.random.default_rng(seed).standard_normal(64).astype(np.float32).tolist()


def test_v2_server_live_ready_and_metadata(client) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "mservd"
    assert "binary_tensor_data" in meta["extensions"]


def test_v2_model_ready_and_metadata_also_per_version(client, auth) -> None:
    assert client.is_model_ready("tiny", headers=dict(auth))
    assert client.is_model_ready("v2typed", "2.0", headers=dict(auth))
    meta = client.get_model_metadata("v2typed", headers=dict(auth))
    assert meta["name"] == "v2typed"
    assert sorted(meta["versions"]) == ["1.0", "2.0"]
    assert meta["inputs"] == V2_CONFIG["v2"]["inputs"]
    assert meta["outputs"] == V2_CONFIG["v2"]["outputs"]
    assert client.get_model_metadata("v2typed", "2.0", headers=dict(auth))["name"] == "v2typed"
    tiny = client.get_model_metadata("tiny", headers=dict(auth))  # samples/tiny/model-config.yaml
    assert tiny["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64]}]
    assert tiny["outputs"] == [{"name": "output0", "datatype": "FP32", "shape": [1, 10]}]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_v2_infer_fp32_matches_predictions(daemon, client, auth, binary) -> None:
    values = tiny_input(1)
    expected = daemon.predict("tiny", json=values)
    assert expected.status_code == 200, expected.text
    x = tritonhttp.InferInput("INPUT0", [1, 64], "FP32")
    x.set_data_from_numpy(np.array([values], dtype=np.float32), binary_data=binary)
    outputs = [tritonhttp.InferRequestedOutput("output0", binary_data=binary)]
    result = client.infer("tiny", [x], outputs=outputs, headers=dict(auth))
    got = result.as_numpy("output0")
    assert got.dtype == np.float32 and got.shape == (1, 10)
    np.testing.assert_array_equal(got[0], np.array(expected.json(), dtype=np.float32))


def test_v2_infer_default_binary_output(client, auth) -> None:
    x = tritonhttp.InferInput("INPUT0", [1, 64], "FP32")
    x.set_data_from_numpy(np.array([tiny_input(2)], dtype=np.float32))
    result = client.infer("tiny", [x], headers=dict(auth))  # no outputs: all of them, binary
    assert result.as_numpy("output0").shape == (1, 10)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_v2_infer_int64_and_bytes_match_predictions(daemon, client, auth, binary) -> None:
    numbers = [3, -7, 2**40]
    words = ["héllo", "world"]
    expected = daemon.predict("v2typed", json={"NUMBERS": numbers, "WORDS": words}).json()
    a = tritonhttp.InferInput("NUMBERS", [3], "INT64")
    a.set_data_from_numpy(np.array(numbers, dtype=np.int64), binary_data=binary)
    b = tritonhttp.InferInput("WORDS", [2], "BYTES")
    b.set_data_from_numpy(np.array([w.encode() for w in words], dtype=object),
                          binary_data=binary)
    outputs = [tritonhttp.InferRequestedOutput(n, binary_data=binary)
               for n in ("DOUBLED", "SHOUTED")]
    result = client.infer("v2typed", [a, b], outputs=outputs, headers=dict(auth), model_version="2.0")
    assert result.as_numpy("DOUBLED").tolist() == expected["DOUBLED"]
    shouted = [w.decode() if isinstance(w, bytes) else w for w in result.as_numpy("SHOUTED")]
    assert shouted == expected["SHOUTED"]
    assert result.get_response()["model_version"] == "2.0"


def test_concurrent_v2_requests_are_batched(daemon, client, auth) -> None:
    # tritonclient.http is gevent-based: concurrency comes from async_infer, not threads
    def send(i: int, word: str = ""):
        a = tritonhttp.InferInput("NUMBERS", [2], "INT64")
        a.set_data_from_numpy(np.array([i, i + 1], dtype=np.int64))
        b = tritonhttp.InferInput("WORDS", [1], "BYTES")
        b.set_data_from_numpy(np.array([(word or f"w{i}").encode()], dtype=object))
        return client.async_infer("v2typed", [a, b], headers=dict(auth))

    mark = daemon.log_end("model_v2typed.log")
    busy = send(99, "slow")  # keeps the only worker busy while the others queue
    daemon.wait_for_log("model_v2typed.log", "v2typed sleeping", since=mark)
    pending = [send(i) for i in range(16)]
    results = []
    for request in pending:
        result = request.get_result()
        results.append((result.as_numpy("DOUBLED").tolist(), result.as_numpy("SHOUTED")[0],
                        int(result.as_numpy("BATCH")[0])))
    assert [r[0] for r in results] == [[2 * i, 2 * i + 2] for i in range(16)]
    assert [r[1] for r in results] == [f"W{i}".encode() for i in range(16)]
    assert max(r[2] for r in results) > 1
    assert busy.get_result().as_numpy("SHOUTED")[0] == b"SLOW"


def test_v2_plain_handler_gets_the_body_and_answers_one_output(daemon, auth) -> None:
    doc = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                       "data": ['{"value": "x"}']}]}
    answer = requests.post(daemon.url("inference", "/v2/models/echobatch/infer"), json=doc,
                           headers=dict(auth), timeout=60)
    assert answer.status_code == 200, answer.text
    out = answer.json()["outputs"][0]
    assert out["name"] == "output0" and out["datatype"] == "BYTES" and out["shape"] == [1]
    assert json.loads(out["data"][0])["echo"] == '{"value": "x"}'


def test_v2_errors_are_clear_and_leave_the_daemon_serving(daemon, client, auth) -> None:
    tiny_workers = daemon.worker_pids("tiny")
    v2typed_workers = daemon.worker_pids("v2typed")
    x = tritonhttp.InferInput("INPUT0", [1, 64], "FP32")
    x.set_data_from_numpy(np.array([tiny_input(3)], dtype=np.float32))
    with pytest.raises(InferenceServerException, match="Model not found: nope"):
        client.infer("nope", [x], headers=dict(auth))
    with pytest.raises(InferenceServerException, match="Model not found: nope"):
        client.get_model_metadata("nope", headers=dict(auth))
    wrong = tritonhttp.InferInput("NUMBERS", [3], "FP32")
    wrong.set_data_from_numpy(np.zeros(3, dtype=np.float32))
    words = tritonhttp.InferInput("WORDS", [1], "BYTES")
    words.set_data_from_numpy(np.array([b"a"], dtype=object))
    with pytest.raises(InferenceServerException, match="has datatype FP32, the model expects "
                                                       "INT64"):
        client.infer("v2typed", [wrong, words], headers=dict(auth))
    shaped = tritonhttp.InferInput("NUMBERS", [1, 3], "INT64")
    shaped.set_data_from_numpy(np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(InferenceServerException, match=r"has shape \[1, 3\], the model expects"):
        client.infer("v2typed", [shaped, words], headers=dict(auth))
    short = tritonhttp.InferInput("INPUT0", [1, 3], "FP32")
    short.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException, match=re.escape(
            "Input 'INPUT0' has shape [1, 3], the model expects [1, 64].")):
        client.infer("tiny", [short], headers=dict(auth))  # as Triton refuses it, not the handler
    answer = requests.post(daemon.url("inference", "/v2/models/tiny/infer"), timeout=30,
                           headers=dict(auth), json={
                               "inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32",
                                           "data": tiny_input(3)}],
                               "outputs": [{"name": "nope"}]})  # the client's mistake: a 400
    assert answer.status_code == 400, answer.text
    assert "Requested output 'nope' is not produced" in answer.json()["error"]

    url = daemon.url("inference", "/v2/models/tiny/infer")
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 256}}]}).encode()
    body = header + np.zeros(64, dtype=np.float32).tobytes()
    for length, needle in ((len(header) - 5, "not valid JSON"),
                           (len(body) + 1, "Inference-Header-Content-Length"),
                           ("abc", "not an integer")):
        answer = requests.post(url, data=body, timeout=30, headers={
            **auth, "Inference-Header-Content-Length": str(length)})
        assert answer.status_code == 400, answer.text
        assert needle in answer.json()["error"]
    answer = requests.post(url, data=body, timeout=30, headers=dict(auth))  # no header length
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]
    answer = requests.post(url, timeout=30, headers={"Authorization": "Bearer wrong"},
                           json={"inputs": []})
    assert answer.status_code == 401 and "error" in answer.json()

    # the daemon is unharmed: the workers that met the bad requests still serve
    assert daemon.worker_pids("tiny") == tiny_workers
    assert daemon.worker_pids("v2typed") == v2typed_workers
    result = client.infer("tiny", [x], headers=dict(auth))
    assert result.as_numpy("output0").shape == (1, 10)
    assert daemon.predict("tiny", json=tiny_input(3)).status_code == 200
