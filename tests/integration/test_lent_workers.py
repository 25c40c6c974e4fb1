"""An idle worker lent to a frontend (``mservd/core/leases.py``), against the real daemon (mostly with
token authorization off, to keep the requests short): requests past the queue are answered and
counted, only with the live inference key when tokens are checked, and a lease never outlives
what it stands for — a rotated key, a changed default version, a worker killed or hung
mid-request."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import requests
from conftest import too_late_behind_a_busy_worker, wait_until

OPEN = {"disable_token_authorization": "true"}
ECHO = '{model_name="echo",model_version="1.0"}'
WORKER_DIED = {"code": 500, "type": "InternalServerException", "message": "Worker died."}


def leased(daemon) -> float:
    return daemon.metrics().get(f"mservd_leased_requests_total{ECHO}", 0.0)


def sequential(daemon, count: int, version: str | None = None) -> list[dict]:
    bodies = []
    for i in range(count):
        answer = daemon.predict("echo", version, json={"i": i})
        assert answer.status_code == 200, answer.text
        bodies.append(answer.json())
    return bodies


def test_a_lone_client_is_answered_by_a_lent_worker_and_every_request_counted(
        daemon_factory) -> None:
    daemon = daemon_factory({**OPEN, "load_models": "echo.mar"})
    bodies = sequential(daemon, 40)
    assert [b["echo"] for b in bodies] == [{"i": i} for i in range(40)]
    wait_until(lambda: daemon.metrics().get(f"ts_inference_requests_total{ECHO}") == 40, 10,
               "every request counted once")
    # once a worker is lent (how soon varies with the minute), the requests pass the
    # controller's queue
    before = leased(daemon)
    sequential(daemon, 20)
    wait_until(lambda: daemon.metrics().get(f"ts_inference_requests_total{ECHO}") == 60, 10,
               "every request counted once")
    assert leased(daemon) - before >= 15


def test_a_request_too_big_for_the_job_socket_still_gets_its_answer_on_a_lease(
        daemon_factory) -> None:
    daemon = daemon_factory({**OPEN, "load_models": "echo.mar"})
    sequential(daemon, 10)
    wait_until(lambda: leased(daemon) > 0, 10, "requests on a lease")
    big = "x" * (300 * 1024)  # over JOB_MESSAGE_MAX: the controller's way, whatever the lease
    answer = daemon.predict("echo", json={"big": big})
    assert answer.status_code == 200, answer.text[:200]
    assert answer.json()["echo"] == {"big": big}
    assert [b["echo"] for b in sequential(daemon, 10)] == [{"i": i} for i in range(10)]


def test_under_token_authorization_a_lease_serves_only_the_live_inference_key(
        daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar"})  # token authorization on
    sequential(daemon, 20)
    wait_until(lambda: daemon.metrics().get(f"ts_inference_requests_total{ECHO}") == 20, 10,
               "every request counted")
    assert leased(daemon) >= 10
    url = daemon.url("inference", "/predictions/echo")
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        refused = requests.post(url, json={}, headers=headers, timeout=10)
        assert refused.status_code == 401, refused.text
    old = daemon.key("inference")
    rotated = requests.get(daemon.url("management", "/token"), params={"type": "inference"},
                           headers={"Authorization": f"Bearer {daemon.key('API')}"}, timeout=10)
    assert rotated.status_code == 200, rotated.text
    stale = requests.post(url, json={}, headers={"Authorization": f"Bearer {old}"}, timeout=10)
    assert stale.status_code == 401, stale.text  # the lease checked the old key's digest
    before = leased(daemon)
    assert [b["echo"] for b in sequential(daemon, 20)] == [{"i": i} for i in range(20)]
    wait_until(lambda: leased(daemon) >= before + 10, 10, "the new key's requests on a lease")


def test_a_new_default_version_answers_the_next_request_despite_a_lease(daemon_factory) -> None:
    daemon = daemon_factory(OPEN, args=("--enable-model-api",))
    for url in ("echo.mar", "echo-2.0.mar"):
        assert daemon.manage("POST", "/models", params={"url": url}).status_code == 200
    assert {b["version"] for b in sequential(daemon, 10)} == {"1.0"}
    wait_until(lambda: leased(daemon) > 0, 10, "requests on a lease")
    assert daemon.manage("PUT", "/models/echo/2.0/set-default").status_code == 200
    assert {b["version"] for b in sequential(daemon, 10)} == {"2.0"}


def sleeping_pid(daemon, seconds: int) -> int | None:
    """The worker whose log says it is sleeping ``seconds`` (the echo handler's print)."""
    log = (daemon.log_dir / "model_echo.log").read_text(errors="replace")
    found = re.findall(rf"\[pid (\d+)\][^\n]*echo sleeping {seconds}", log)
    return int(found[-1]) if found else None


def test_a_lent_worker_killed_mid_request_leaves_no_client_without_an_answer(
        daemon_factory) -> None:
    daemon = daemon_factory({**OPEN, "load_models": "echo.mar", "default_workers_per_model": 2})
    sequential(daemon, 10)
    wait_until(lambda: leased(daemon) > 0, 10, "requests on a lease")
    answers: list[requests.Response] = []
    client = threading.Thread(target=lambda: answers.append(
        daemon.predict("echo", json={"sleep": 3})))
    started = time.monotonic()
    client.start()
    pid = wait_until(lambda: sleeping_pid(daemon, 3), 10, "the request to run")
    os.kill(pid, signal.SIGKILL)
    client.join(60)
    [answer] = answers
    assert answer.status_code == 200, answer.text  # sent again, to the other worker
    assert answer.json()["echo"] == {"sleep": 3}
    assert time.monotonic() - started < 30
    wait_until(lambda: pid not in daemon.worker_pids("echo") and
               len(daemon.worker_pids("echo")) == 2, 30, "the worker replaced")
    assert [b["echo"] for b in sequential(daemon, 5)] == [{"i": i} for i in range(5)]


def test_a_leased_request_that_hangs_is_answered_worker_died_and_its_worker_replaced(
        daemon_factory) -> None:
    daemon = daemon_factory(OPEN, args=("--enable-model-api",))
    answer = daemon.manage("POST", "/models", params={"url": "echo.mar", "response_timeout": 2})
    assert answer.status_code == 200, answer.text
    sequential(daemon, 10)
    wait_until(lambda: leased(daemon) > 0, 10, "requests on a lease")
    [pid] = daemon.worker_pids("echo")
    started = time.monotonic()
    hung = daemon.predict("echo", json={"sleep": 60})
    assert (hung.status_code, hung.json()) == (500, WORKER_DIED)
    assert time.monotonic() - started < 30  # the 2 s response timeout, not the handler's 60 s
    wait_until(lambda: daemon.worker_pids("echo") - {pid}, 30, "a new worker")
    wait_until(lambda: daemon.describe("echo")[0]["workers"][0]["status"] == "READY", 30,
               "the new worker to load")
    assert [b["echo"] for b in sequential(daemon, 3)] == [{"i": i} for i in range(3)]


def test_a_request_that_comes_while_a_leased_one_runs_keeps_its_deadline(daemon_factory) -> None:
    daemon = daemon_factory({**OPEN, "load_models": "echo.mar"})
    sequential(daemon, 10)
    wait_until(lambda: leased(daemon) > 0, 10, "requests on a lease")
    late, mark = too_late_behind_a_busy_worker(daemon)  # the busy one on the lease
    # it waited in the queue while the worker was called back, and its deadline passed there
    assert late.status_code == 504, late.text
    assert daemon.predict("echo", json={"marker": "after-late"}).status_code == 200
    daemon.wait_for_log("model_echo.log", "after-late", since=mark)
    assert "too-late" not in daemon.read_log("model_echo.log", since=mark)
