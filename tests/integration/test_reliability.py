"""Faults and overload: every accepted request gets exactly one answer, quickly."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import requests
from conftest import grpc_frontend, too_late_behind_a_busy_worker, wait_until

WORKER_DIED = {"code": 500, "type": "InternalServerException", "message": "Worker died."}
ECHO = '{model_name="echo",model_version="1.0"}'


def kill_three_workers(daemon, killed: list[int], answers: list) -> None:
    for _ in range(3):
        count = len(answers)  # the clients are served between kills
        wait_until(lambda count=count: len(answers) > count + 8, 30, "more answers")
        pid = min(daemon.worker_pids("echo"))
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        wait_until(lambda: len(ready_pids(daemon) - set(killed)) == 2, 60,
                   "two live workers again")
    count = len(answers)
    wait_until(lambda: len(answers) > count + 8, 30, "more answers")


def ready_pids(daemon) -> set[int]:
    return {w["pid"] for w in daemon.describe("echo")[0]["workers"] if w["status"] == "READY"}


def ping(daemon) -> int:
    return requests.get(daemon.url("inference", "/ping"), timeout=10).status_code


def test_killed_workers_are_replaced_and_every_request_is_answered(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar", "default_workers_per_model": 2})
    stop = threading.Event()
    answers: list[tuple[int, dict, float]] = []

    def client(n: int) -> None:
        session = requests.Session()
        headers = {"Authorization": f"Bearer {daemon.key('inference')}"}
        i = 0
        while not stop.is_set():
            started = time.monotonic()
            answer = session.post(daemon.url("inference", "/predictions/echo"), timeout=60,
                                  json={"sleep": 0.05, "client": n, "i": i}, headers=headers)
            answers.append((answer.status_code, answer.json(), time.monotonic() - started))
            i += 1

    killed = []
    with ThreadPoolExecutor(4) as pool:
        for n in range(4):
            pool.submit(client, n)
        try:
            kill_three_workers(daemon, killed, answers)
        finally:
            stop.set()
    assert len(answers) > 20
    for status, body, took in answers:
        assert status == 200 or (status, body) == (500, WORKER_DIED) or status == 503, body
        assert took < 30
        if status == 200:
            assert body["echo"]["sleep"] == 0.05
    assert [s for s, _, _ in answers[-8:]] == [200] * 8  # success resumes
    assert not daemon.worker_pids("echo") & set(killed)
    assert ping(daemon) == 200


def test_ping_is_unhealthy_while_a_model_is_below_min_workers(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar"})
    assert ping(daemon) == 200
    [pid] = daemon.worker_pids("echo")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: ping(daemon) == 500, 10, "/ping to say Unhealthy")
    answer = requests.get(daemon.url("inference", "/ping"), timeout=10)
    assert answer.json() == {"status": "Unhealthy"}
    wait_until(lambda: ping(daemon) == 200, 30, "/ping to recover")
    assert daemon.predict("echo", json={"after": "restart"}).status_code == 200


def test_a_hanging_handler_is_killed_at_response_timeout(daemon_factory) -> None:
    daemon = daemon_factory(args=("--enable-model-api",))
    answer = daemon.manage("POST", "/models", params={"url": "echo.mar", "response_timeout": 2})
    assert answer.status_code == 200, answer.text
    [pid] = daemon.worker_pids("echo")
    started = time.monotonic()
    hung = daemon.predict("echo", json={"sleep": 60})
    took = time.monotonic() - started
    assert (hung.status_code, hung.json()) == (500, WORKER_DIED)
    assert took < 30  # killed at the 2 s response timeout, long before the handler's 60 s
    wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
               if psutil.pid_exists(pid) else True, 10, "the hung worker to die")
    new = wait_until(lambda: daemon.worker_pids("echo") - {pid}, 30, "a new worker")
    assert new
    wait_until(lambda: daemon.describe("echo")[0]["workers"][0]["status"] == "READY", 30,
               "the new worker to load")
    assert daemon.predict("echo", json={"ok": 1}).status_code == 200


def test_a_full_queue_refuses_at_once_and_late_requests_get_504(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar", "job_queue_size": 3})

    def slow(i: int):
        started = time.monotonic()
        answer = daemon.predict("echo", json={"sleep": 0.6, "i": i})
        return answer, time.monotonic() - started

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(slow, range(12)))
    accepted = [(a, t) for a, t in results if a.status_code == 200]
    refused = [(a, t) for a, t in results if a.status_code == 503]
    assert len(accepted) + len(refused) == 12
    assert 1 <= len(accepted) <= 6 and len(refused) >= 6
    for answer, took in refused:
        assert answer.json()["type"] == "QueueFullException"
        assert answer.headers["Retry-After"] == "1"
        assert took < 1.5  # refused on arrival, not after waiting behind 0.6 s requests
    for answer, _ in accepted:
        assert answer.json()["echo"]["sleep"] == 0.6

    # a request whose own deadline passes while the worker is busy is answered 504, never run
    late, mark = too_late_behind_a_busy_worker(daemon)
    assert late.status_code == 504
    assert late.json()["type"] == "RequestTimeoutException"
    assert "it was not computed" in late.json()["message"]
    # one worker takes requests in order: once a later one is computed, the late one never is
    assert daemon.predict("echo", json={"marker": "after-late"}).status_code == 200
    daemon.wait_for_log("model_echo.log", "after-late", since=mark)
    assert "too-late" not in daemon.read_log("model_echo.log", since=mark)
    for invalid in ("soon", "nan"):  # NaN would compare as no deadline at all
        bad = daemon.predict("echo", json={}, headers={"X-Request-Timeout-Ms": invalid})
        assert bad.status_code == 400, bad.text

    # a request whose client goes away while it is queued is dropped, never computed
    host, port = daemon.url("inference", "").removeprefix("http://").rsplit(":", 1)
    body = b'{"marker": "abandoned"}'
    with ThreadPoolExecutor(1) as pool:
        mark = daemon.log_end("model_echo.log")
        # long enough to connect, queue, poll /metrics and hang up on a slow minute
        busy = pool.submit(daemon.predict, "echo", json={"sleep": 4.0})
        daemon.wait_for_log("model_echo.log", "echo sleeping", since=mark)
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(
                f"POST /predictions/echo HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {daemon.key('inference')}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                .encode() + body)
            wait_until(lambda: daemon.metrics().get(f"mservd_pending_requests{ECHO}") == 1, 10,
                       "the abandoned request to queue", details=daemon.logs)
        assert busy.result().status_code == 200
    daemon.wait_for_log("mservd.log", "client went away", timeout=10)
    # computed in order, as above: once a later request is, the dropped one never will be
    assert daemon.predict("echo", json={"after": "the dropped one"}).status_code == 200
    daemon.wait_for_log("model_echo.log", "the dropped one", since=mark)
    assert "abandoned" not in daemon.read_log("model_echo.log", since=mark)



def test_a_grpc_calls_x_request_timeout_ms_metadata_is_its_deadline_as_over_http(
        daemon_factory) -> None:
    import grpc

    from mservd.frontends.grpc.generated import inference_pb2, inference_pb2_grpc

    daemon = daemon_factory({"load_models": "echo.mar"})
    channel = grpc.insecure_channel(daemon.grpc_address("inference"))
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    auth = ("authorization", f"Bearer {daemon.key('inference')}")

    def predict(timeout_ms: str) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as err:  # the call's own deadline: 30 s
            stub.Predictions(inference_pb2.PredictionsRequest(
                model_name="echo", input={"data": b'{"marker": "too-late"}'}),
                metadata=[auth, ("x-request-timeout-ms", timeout_ms)], timeout=30)
        return err.value

    late, mark = too_late_behind_a_busy_worker(daemon, lambda: predict("300"))
    assert late.code() == grpc.StatusCode.DEADLINE_EXCEEDED, late.details()
    assert "it was not computed" in late.details()
    for invalid in ("soon", "nan", "-5"):
        refused = predict(invalid)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Invalid X-Request-Timeout-Ms" in refused.details()
    assert "too-late" not in daemon.read_log("model_echo.log", since=mark)
    channel.close()


def test_a_refusal_for_one_clients_short_deadline_does_not_hold_the_others(
        daemon_factory) -> None:
    """One HTTP frontend, one echo worker busy and a request queued behind it: a request whose
    own X-Request-Timeout-Ms the queue cannot meet is refused at once, and a request without
    one right after it is queued and answered — the frontend holds only a refusal for
    overload, not one for a single client's deadline."""
    daemon = daemon_factory({"load_models": "echo.mar", "frontend_workers": 1,
                             "lend_idle_workers": "false"})
    assert daemon.predict("echo", json={"sleep": 0.3}).status_code == 200  # its batch time
    with ThreadPoolExecutor(2) as pool:
        mark = daemon.log_end("model_echo.log")
        busy = pool.submit(daemon.predict, "echo", json={"sleep": 3.0})
        daemon.wait_for_log("model_echo.log", "echo sleeping", since=mark)
        queued = pool.submit(daemon.predict, "echo", json={"queued": 1})
        wait_until(lambda: daemon.metrics().get(f"mservd_pending_requests{ECHO}") == 1, 30,
                   "a request to queue behind the busy worker", details=daemon.logs)
        short = daemon.predict("echo", json={"short": 1}, headers={"X-Request-Timeout-Ms": "5"})
        patient = daemon.predict("echo", json={"patient": 1})
        assert busy.result().status_code == 200 and queued.result().status_code == 200
    assert short.status_code == 503, short.text
    assert "within its deadline" in short.json()["message"]
    assert patient.status_code == 200, patient.text
    assert patient.json()["echo"] == {"patient": 1}


def test_a_latency_target_stops_refusing_clients_that_resend_at_once(daemon_factory) -> None:
    """Eight clients each sending again at once keep the echo model (50 ms a request) past
    its 100 ms target: the target refuses them at first, then sees that its refusals only come
    straight back (spinning.py), and lets them queue and be answered."""
    targets = {"echo": {"1.0": {"maxLatencyMs": 100, "batchSize": 1}}}
    daemon = daemon_factory({"load_models": "echo.mar", "models": json.dumps(targets)})
    url = daemon.url("inference", "/predictions/echo")
    headers = {"Authorization": f"Bearer {daemon.key('inference')}"}
    outcomes: list[tuple[float, int]] = []
    # the rest (SPIN_REST, 5 s) begins at 0.5 s at the soonest: the last second of 5.5 lies in it if
    # the frontend and the controller both saw the spin within 4.5 s, a slow minute included
    end = time.monotonic() + 5.5

    def client(_: int) -> None:
        session = requests.Session()
        while time.monotonic() < end:
            status = session.post(url, json={"sleep": 0.05}, headers=headers,
                                  timeout=30).status_code
            outcomes.append((time.monotonic(), status))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client, range(8)))
    assert {status for _, status in outcomes} <= {200, 503}
    refused = [t for t, status in outcomes if status == 503]
    answered = [t for t, status in outcomes if status == 200]
    assert len(refused) >= 64  # over the target, it shed at first
    late = [t for t in refused if t > end - 1.0]
    assert len(late) < 8, f"{len(late)} refused in the last second of {len(refused)}"
    assert len([t for t in answered if t > end - 1.0]) >= 8  # queued and served instead


def test_sigkill_of_the_daemon_leaves_no_process_behind(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar", "default_workers_per_model": 2})
    children = daemon.descendants()
    assert len(children) >= 4  # frontend master + its worker + 2 model workers
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait()
    _, alive = psutil.wait_procs(children, timeout=40)
    assert alive == []


def test_a_crash_looping_model_does_not_slow_the_others(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar"}, args=("--enable-model-api",))
    answer = daemon.manage("POST", "/models", params={"url": "diesoon.mar",
                                                      "synchronous": "false"})
    assert answer.status_code == 202, answer.text
    def restarts() -> float:
        text = requests.get(daemon.url("metrics", "/metrics"), timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("mservd_worker_restarts_total{")
                   and 'model_name="diesoon"' in line)

    slowest = 0.0
    deadline = time.monotonic() + 90
    while restarts() < 2 and time.monotonic() < deadline:  # two crash-and-restart rounds
        answer = daemon.predict("echo", json={"during": "crash loop"})
        assert answer.status_code == 200
        slowest = max(slowest, answer.elapsed.total_seconds())
    assert restarts() >= 2, "diesoon never crashed twice"
    assert slowest < 5.0  # echo answers in milliseconds, whatever diesoon is doing
    # a request that kills its worker gets one answer: the worker died
    wait_until(lambda: any(w["status"] == "READY"
                           for w in daemon.describe("diesoon")[0]["workers"]), 30,
               "diesoon to be up between crashes")
    killed = daemon.predict("diesoon", json={})
    assert killed.status_code in (500, 503)
    if killed.status_code == 500:
        assert killed.json() == WORKER_DIED


def answers_ping(daemon) -> bool:
    try:
        return ping(daemon) == 200
    except requests.ConnectionError:
        return False


def test_a_killed_http_worker_is_replaced_by_gunicorn_and_counted(daemon_factory) -> None:
    from conftest import http_workers

    daemon = daemon_factory({"load_models": "echo.mar"})  # one HTTP worker: none is left
    [worker] = http_workers(daemon)
    for i in range(3):  # the model's worker now answers this HTTP worker's reply socket
        assert daemon.predict("echo", json={"before": i}).json()["echo"] == {"before": i}
    os.kill(worker.pid, signal.SIGKILL)
    wait_until(lambda: [w.pid for w in http_workers(daemon)] not in ([], [worker.pid]), 30,
               "gunicorn to start another worker")
    wait_until(lambda: answers_ping(daemon), 30, "the inference port answering again")
    for i in range(3):  # ... and finds the new one's
        assert daemon.predict("echo", json={"after": i}).json()["echo"] == {"after": i}
    assert daemon.manage("GET", "/models").status_code == 200
    assert f"Worker (pid:{worker.pid}) was sent SIGKILL" in (
        daemon.log_dir / "frontend.log").read_text()
    wait_until(lambda: 'mservd_frontend_restarts_total{frontend="http"} 1.0' in requests.get(
        daemon.url("metrics", "/metrics"), timeout=10).text, 10, "the restart to be counted")


def test_a_killed_arbiter_and_grpc_frontend_are_started_again_on_the_same_ports(
        daemon_factory) -> None:
    import grpc
    from conftest import http_arbiter
    from google.protobuf import empty_pb2

    from mservd.frontends.grpc.generated import inference_pb2_grpc

    daemon = daemon_factory({"load_models": "echo.mar"})
    arbiter = http_arbiter(daemon)
    old_grpc = grpc_frontend(daemon)
    os.kill(arbiter.pid, signal.SIGKILL)  # its workers notice and leave within a second
    os.kill(old_grpc.pid, signal.SIGKILL)

    wait_until(lambda: (http_arbiter(daemon) or arbiter).pid != arbiter.pid, 30,
               "a new arbiter")
    wait_until(lambda: answers_ping(daemon), 30, "the inference port answering again")
    assert daemon.predict("echo", json={"after": "restart"}).json()["echo"] == {"after": "restart"}
    assert daemon.manage("GET", "/models").status_code == 200  # the same ports
    channel = grpc.insecure_channel(daemon.grpc_address("inference"))  # the address it had
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    wait_until(lambda: (grpc_frontend(daemon) or old_grpc).pid != old_grpc.pid, 10,
               "a new gRPC frontend")
    health = stub.Ping(empty_pb2.Empty(), timeout=30, wait_for_ready=True)
    assert json.loads(health.health)["status"] == "Healthy"
    logs = (daemon.log_dir / "mservd.log").read_text()
    assert (f"HTTP frontend (gunicorn's arbiter) (pid {arbiter.pid}) was killed by SIGKILL; "
            "starting it again") in logs
    assert "gRPC frontend started again" in logs
    metrics = requests.get(daemon.url("metrics", "/metrics"), timeout=10).text
    assert 'mservd_frontend_restarts_total{frontend="http"} 1.0' in metrics
    assert 'mservd_frontend_restarts_total{frontend="grpc"} 1.0' in metrics


def test_an_arbiter_killed_while_the_models_load_is_started_again(tmp_path, store) -> None:
    from conftest import Daemon, http_arbiter

    workdir = tmp_path / "d"
    workdir.mkdir()
    daemon = Daemon(workdir, store, {"load_models": "slowinit.mar"})
    starting = threading.Thread(target=daemon.start)  # returns once the model has loaded
    starting.start()
    try:
        wait_until(lambda: daemon.proc is not None and http_arbiter(daemon), 30,
                   "gunicorn's arbiter")
        arbiter = http_arbiter(daemon)
        log = daemon.log_dir / "frontend.log"
        wait_until(lambda: log.exists() and "ASGI server listening" in log.read_text(), 30,
                   "a worker serving")
        os.kill(arbiter.pid, signal.SIGKILL)  # it served, and the model is still loading
        starting.join(timeout=60)
        assert daemon.state, "the daemon did not become ready"
        assert daemon.proc.poll() is None
        wait_until(lambda: answers_ping(daemon), 30, "the inference port answering again")
        logs = (daemon.log_dir / "mservd.log").read_text()
        assert f"(pid {arbiter.pid}) was killed by SIGKILL; starting it again" in logs
        assert "exited as it started" not in logs
    finally:
        starting.join(timeout=60)
        daemon.stop()


def test_a_frontend_that_keeps_failing_to_start_stops_the_daemon(daemon_factory) -> None:
    import re

    from conftest import http_workers

    daemon = daemon_factory({"load_models": "echo.mar"})
    children = daemon.descendants()
    access_log = daemon.log_dir / "access_log.log"
    access_log.rename(daemon.log_dir / "access_log.old")
    access_log.mkdir()  # a new worker cannot open its access log any more
    [worker] = http_workers(daemon)
    os.kill(worker.pid, signal.SIGKILL)  # gunicorn's replacement fails to boot: it halts

    assert daemon.proc.wait(timeout=90) == 1  # five arbiters that fail, a second apart
    logs = (daemon.log_dir / "mservd.log").read_text()
    assert re.search(r"HTTP frontend \(gunicorn's arbiter\) exited with code \d+ before it "
                     r"served, 5 starts in a row", logs), logs[-3000:]
    assert "IsADirectoryError" in logs
    assert "stopping: no HTTP frontend can run" in logs
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == []
