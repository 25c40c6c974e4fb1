"""KServe's V1 protocol: each instance a row of the batch, predictions joined per request."""

from __future__ import annotations

import pytest
import requests


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    daemon = Daemon(tmp_path_factory.mktemp("v1-daemon"), store,
                    {"load_models": "tiny.mar,echo.mar"})
    daemon.start()
    yield daemon
    daemon.stop()


def v1(daemon, method: str, path: str, **kwargs) -> requests.Response:
    headers = {"Authorization": f"Bearer {daemon.key('inference')}", **kwargs.pop("headers", {})}
    return requests.request(method, daemon.url("inference", path), headers=headers, timeout=60,
                            **kwargs)


def test_v1_lists_models_and_readiness(daemon) -> None:
    listed = v1(daemon, "GET", "/v1/models").json()
    assert listed["models"] == ["echo", "tiny"]  # KServe's shape; OpenAI's beside it
    assert [m["id"] for m in listed["data"]] == ["echo", "tiny"]
    one = v1(daemon, "GET", "/v1/models/tiny").json()
    assert (one["name"], one["ready"], one["id"], one["object"]) == ("tiny", True, "tiny", "model")
    missing = v1(daemon, "GET", "/v1/models/nope")
    assert missing.status_code == 404
    assert missing.json() == {"error": "Model not found: nope"}


def test_v1_predict_gives_the_same_numbers_as_predictions(daemon) -> None:
    instances = [[0.5] * 64, [(-1) ** i * 0.1 * i for i in range(64)]]
    answer = v1(daemon, "POST", "/v1/models/tiny:predict", json={"instances": instances})
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    expected = [daemon.predict("tiny", json=x).json() for x in instances]
    assert len(predictions) == 2
    for got, want in zip(predictions, expected):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_v1_instances_run_as_rows_of_one_batch(daemon) -> None:
    answer = v1(daemon, "POST", "/v1/models/echo:predict",
                json={"instances": [{"a": 1}, {"b": 2}, {"c": 3}]})
    assert answer.status_code == 200, answer.text
    predictions = answer.json()["predictions"]
    assert [p["echo"] for p in predictions] == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert {p["batch_size"] for p in predictions} == {3}
    assert len({p["request_id"] for p in predictions}) == 1


def test_v1_errors_are_clear_and_leave_the_daemon_serving(daemon) -> None:
    for body in (b"not json", b'{"inputs": []}', b'{"instances": 3}'):
        answer = v1(daemon, "POST", "/v1/models/tiny:predict", data=body,
                    headers={"Content-Type": "application/json"})
        assert answer.status_code == 400, answer.text
        assert "instances" in answer.json()["error"] or "JSON" in answer.json()["error"]
    failing = v1(daemon, "POST", "/v1/models/echo:predict",
                 json={"instances": [{"ok": 1}, {"fail": True}]})
    assert failing.status_code == 400
    assert failing.json() == {"error": "request 1 asked to fail"}
    unauthorized = requests.post(daemon.url("inference", "/v1/models/tiny:predict"),
                                 json={"instances": [[0.0] * 64]}, timeout=30)
    assert unauthorized.status_code == 401 and "error" in unauthorized.json()
    assert v1(daemon, "GET", "/v1/models/tiny:predict").status_code == 405
    ok = v1(daemon, "POST", "/v1/models/tiny:predict", json={"instances": [[0.0] * 64]})
    assert ok.status_code == 200
