"""/explanations: the handler sees TorchServe's explain mark, and an explanation never shares a
batch with predictions."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
import requests


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    workdir = tmp_path_factory.mktemp("explain-daemon")
    daemon = Daemon(workdir, store, {"load_models": "echobatch.mar", "batch_size": 8,
                                     "max_batch_delay": 500})
    daemon.start()
    yield daemon
    daemon.stop()


def behind_a_slow_request(daemon, calls: list) -> list[dict]:
    """Each of ``calls``' answers, made while a slow request holds the only worker, so that
    they queue and batch."""
    since = daemon.log_end("model_echobatch.log")
    with ThreadPoolExecutor(len(calls) + 1) as pool:
        busy = pool.submit(daemon.predict, "echobatch", json={"sleep": 1.5})
        daemon.wait_for_log("model_echobatch.log", "echo sleeping", since)
        answers = [future.result() for future in [pool.submit(call) for call in calls]]
        assert busy.result().status_code == 200
    return answers


def test_explanations_and_predictions_queued_together_run_in_separate_batches(daemon) -> None:
    def call(route: str, i: int) -> dict:
        answer = requests.post(daemon.url("inference", f"/{route}/echobatch"),
                               json={"value": f"{route}-{i}"}, timeout=60,
                               headers=daemon._headers("inference", None))
        assert answer.status_code == 200, answer.text
        return answer.json()

    answers = behind_a_slow_request(daemon, [partial(call, route, i) for i in range(4)
                                             for route in ("predictions", "explanations")])
    for answer in answers:
        wanted = "True" if answer["echo"]["value"].startswith("explanations") else None
        assert answer["explain"] == [wanted] * answer["batch_size"], answer
    assert max(a["batch_size"] for a in answers) > 1  # they did queue and batch


def test_a_clients_own_explain_or_describe_header_marks_no_row_of_its_batch(daemon) -> None:
    """Only the server marks a row (the route, or describe's question): a header a client sends
    by those names never reaches the handler, so its batch-mates stay predictions."""
    forged = {"explain": "true", "describe": "True"}

    def call(i: int) -> dict:
        answer = daemon.predict("echobatch", json={"value": i},
                                headers=forged if i == 0 else None)
        assert answer.status_code == 200, answer.text
        return answer.json()

    answers = behind_a_slow_request(daemon, [partial(call, i) for i in range(4)])
    assert sorted(a["echo"]["value"] for a in answers) == [0, 1, 2, 3]
    for answer in answers:
        assert answer["explain"] == [None] * answer["batch_size"], answer
    assert max(a["batch_size"] for a in answers) > 1
