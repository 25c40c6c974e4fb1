"""Hostile requests against a running daemon with token auth on: each is refused on its own,
and the worker that met it keeps serving the others."""

from __future__ import annotations

import concurrent.futures

import pytest


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    daemon = Daemon(tmp_path_factory.mktemp("hostile-requests"), store,
                    {"load_models": "echo.mar,echobatch.mar"})
    daemon.start()
    yield daemon
    daemon.stop()


UNDECODABLE = [  # (content type, body): each raised in the worker's decode and killed it
    ("application/json", b"[" * 3000),
    ("text/plain; charset=undefined", b"hello"),
    ("text/plain; charset=punycode", b"\xff\xfe hello"),
]


@pytest.mark.parametrize(("content_type", "body"), UNDECODABLE,
                         ids=["deep-json", "charset-undefined", "charset-punycode"])
def test_an_undecodable_prediction_fails_alone_and_the_worker_lives(daemon, content_type,
                                                                   body) -> None:
    pids = daemon.worker_pids("echo")
    answer = daemon.predict("echo", data=body, headers={"Content-Type": content_type})
    assert answer.status_code in (200, 400), answer.text
    if answer.status_code == 400:
        assert answer.json()["type"] == "BadRequestException"
        assert "cannot be decoded" in answer.json()["message"]
    assert daemon.worker_pids("echo") == pids
    assert daemon.predict("echo", json={"a": 1}).status_code == 200


def test_deeply_nested_json_is_400_naming_the_problem(daemon) -> None:
    answer = daemon.predict("echo", data=b"[" * 3000,
                            headers={"Content-Type": "application/json"})
    assert answer.status_code == 400
    assert answer.json()["message"] == ("The request's input cannot be decoded: The JSON body "
                                        "is nested too deeply to parse.")


def test_deeply_nested_kserve_v1_body_is_400_and_the_worker_lives(daemon) -> None:
    pids = daemon.worker_pids("echo")
    answer = daemon.session.post(daemon.url("inference", "/v1/models/echo:predict"),
                                 data=b"[" * 3000, headers=daemon._headers("inference", None),
                                 timeout=60)
    assert answer.status_code == 400, answer.text
    assert "nested too deeply" in answer.json()["error"]
    assert daemon.worker_pids("echo") == pids


def test_a_hostile_request_in_a_batch_leaves_the_rest_of_it_answered(daemon) -> None:
    """echobatch has one worker: a slow request holds it while the others queue, then they
    run as one batch with the hostile one in it."""
    from conftest import wait_until

    pids = daemon.worker_pids("echobatch")
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        slow = pool.submit(daemon.predict, "echobatch", json={"sleep": 1.0})
        wait_until(lambda: "echo sleeping" in (daemon.log_dir / "model_echobatch.log")
                   .read_text(errors="replace"), 30, "the slow request to hold the worker")
        good = [pool.submit(daemon.predict, "echobatch", json={"n": i}) for i in range(4)]
        bad = pool.submit(daemon.predict, "echobatch", data=b"[" * 3000,
                          headers={"Content-Type": "application/json"})
        assert slow.result().status_code == 200
        answers = [f.result() for f in good]
        assert bad.result().status_code == 400
    assert [a.status_code for a in answers] == [200] * 4
    assert [a.json()["echo"] for a in answers] == [{"n": i} for i in range(4)]
    assert max(a.json()["batch_size"] for a in answers) > 1  # they did share a batch
    assert daemon.worker_pids("echobatch") == pids
