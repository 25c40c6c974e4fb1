"""Register → predict → scale → version → set-default → unregister, against the real daemon."""

from __future__ import annotations

import psutil
import pytest
from conftest import wait_until

TINY_INPUT = [0.5] * 64


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory(args=("--enable-model-api",))


def test_register_predict_scale_and_unregister_a_sample(daemon, store) -> None:
    answer = daemon.manage("POST", "/models", params={"url": "tiny.mar", "initial_workers": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": 'Model "tiny" Version: 1.0 registered with 1 initial workers'}

    prediction = daemon.predict("tiny", json=TINY_INPUT)
    assert prediction.status_code == 200, prediction.text
    values = prediction.json()
    assert len(values) == 10 and all(isinstance(v, float) for v in values)
    assert prediction.headers["x-request-id"]

    first = daemon.worker_pids("tiny")
    assert len(first) == 1
    answer = daemon.manage("PUT", "/models/tiny",
                           params={"min_worker": 2, "max_worker": 2, "synchronous": "true"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": "Workers scaled to 2 for model: tiny"}
    two = daemon.worker_pids("tiny")
    assert len(two) == 2 and first < two

    answer = daemon.manage("PUT", "/models/tiny", params={"min_worker": 1, "max_worker": 1})
    assert answer.status_code == 202
    assert answer.json() == {"status": "Processing worker updates..."}
    def scaled_down() -> set[int]:
        pids = daemon.worker_pids("tiny")
        return pids if len(pids) == 1 else set()

    one = wait_until(scaled_down, 30, "tiny to scale down to one worker")
    assert one < two
    # a call that names the version is answered naming it, as TorchServe does
    answer = daemon.manage("PUT", "/models/tiny/1.0",
                           params={"min_worker": 1, "synchronous": "true"})
    assert answer.json() == {"status": "Workers scaled to 1 for model: tiny, version: 1.0"}
    gone = two - one

    def exited(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_until(lambda: all(exited(p) for p in gone), 30, f"the stopped worker {gone} to exit")
    assert daemon.predict("tiny", json=TINY_INPUT).status_code == 200

    answer = daemon.manage("DELETE", "/models/tiny")
    assert answer.status_code == 200
    assert answer.json() == {"status": 'Model "tiny" unregistered'}
    answer = daemon.predict("tiny", json=TINY_INPUT)
    assert answer.status_code == 404
    assert answer.json() == {"code": 404, "type": "ModelNotFoundException",
                             "message": "Model not found: tiny"}


def test_versions_and_set_default_change_which_version_answers(daemon) -> None:
    for url in ("echo.mar", "echo-2.0.mar"):
        answer = daemon.manage("POST", "/models", params={"url": url})
        assert answer.status_code == 200, answer.text
    assert daemon.predict("echo", json={"x": 1}).json()["version"] == "1.0"
    assert daemon.predict("echo", "2.0", json={"x": 1}).json()["version"] == "2.0"
    assert daemon.predict("echo", "1.0", json={"x": 1}).json()["version"] == "1.0"

    all_versions = daemon.describe("echo", "all")
    assert [d["modelVersion"] for d in all_versions] == ["1.0", "2.0"]

    answer = daemon.manage("PUT", "/models/echo/2.0/set-default")
    assert answer.status_code == 200
    assert answer.json() == {
        "status": 'Default version successfully updated for model "echo" to "2.0"'}
    assert daemon.predict("echo", json={"x": 1}).json()["version"] == "2.0"

    refused = daemon.manage("DELETE", "/models/echo/2.0")
    assert refused.status_code == 403
    assert "default version" in refused.json()["message"]
    assert daemon.manage("DELETE", "/models/echo/1.0").status_code == 200
    missing = daemon.predict("echo", "1.0", json={"x": 1})
    assert missing.status_code == 404
    assert missing.json()["message"] == "Model version: 1.0 does not exist for model: echo"
    assert daemon.manage("DELETE", "/models/echo/2.0").status_code == 200


def test_list_models_pages_by_name(daemon) -> None:
    for url in ("echo.mar", "tiny.mar", "echobatch.mar"):
        params = {"url": url, "synchronous": "false", "initial_workers": 0}
        assert daemon.manage("POST", "/models", params=params).status_code == 200
    page = daemon.manage("GET", "/models", params={"limit": 2}).json()
    assert page == {"nextPageToken": "2", "models": [
        {"modelName": "echo", "modelUrl": "echo.mar"},
        {"modelName": "echobatch", "modelUrl": "echobatch.mar"}]}
    last = daemon.manage("GET", "/models", params={"limit": 2, "next_page_token": 2}).json()
    assert last == {"models": [{"modelName": "tiny", "modelUrl": "tiny.mar"}]}


def test_describe_shows_real_worker_pids_and_settings(daemon) -> None:
    import datetime

    import psutil

    answer = daemon.manage("POST", "/models",
                           params={"url": "echo.mar", "batch_size": 4, "max_batch_delay": 50,
                                   "initial_workers": 2})
    assert answer.status_code == 200, answer.text
    [desc] = daemon.describe("echo")
    assert (desc["batchSize"], desc["maxBatchDelay"], desc["minWorkers"]) == (4, 50, 2)
    assert desc["jobQueueStatus"] == {"remainingCapacity": 100, "pendingRequests": 0}
    for worker in desc["workers"]:
        assert worker["status"] == "READY"
        started = datetime.datetime.strptime(worker["startTime"], "%Y-%m-%dT%H:%M:%S.%fZ")
        assert abs(started.replace(tzinfo=datetime.UTC).timestamp()
                   - psutil.Process(worker["pid"]).create_time()) < 5  # TorchServe's format
        parent = psutil.Process(worker["pid"]).parent()  # a fork of the zygote
        assert "mservd.worker.zygote" in " ".join(parent.cmdline())
        assert worker["memoryUsage"] > 10 * 2**20
