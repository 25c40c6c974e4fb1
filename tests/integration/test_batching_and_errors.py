"""Dynamic batching under concurrency, and the error answers of API.md."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    workdir = tmp_path_factory.mktemp("errors-daemon")
    daemon = Daemon(workdir, store, {"load_models": "echo.mar,echobatch.mar,tiny.mar",
                                     "batch_size": 4, "max_batch_delay": 200},
                    args=("--enable-model-api",))
    daemon.start()
    yield daemon
    daemon.stop()


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(daemon) -> None:
    def one(i: int) -> dict:
        answer = daemon.predict("echobatch", json={"value": f"req-{i}"}, timeout=60)
        assert answer.status_code == 200, answer.text
        return answer.json()

    with ThreadPoolExecutor(33) as pool:
        # a slow request keeps the only worker busy while the 32 arrive and queue
        mark = daemon.log_end("model_echobatch.log")
        busy = pool.submit(daemon.predict, "echobatch", json={"sleep": 1.5})
        daemon.wait_for_log("model_echobatch.log", "echo sleeping", since=mark)
        results = list(pool.map(one, range(32)))
        assert busy.result().status_code == 200
    assert [r["echo"]["value"] for r in results] == [f"req-{i}" for i in range(32)]
    assert max(r["batch_size"] for r in results) > 1
    assert all(r["batch_size"] <= 8 for r in results)
    assert len({r["request_id"] for r in results}) == 32
    metrics = requests.get(daemon.url("metrics", "/metrics"), timeout=10).text
    labels = 'model_name="echobatch",model_version="1.0"'
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines()
                  if line.startswith("mservd_batch_size"))
    assert float(values[f"mservd_batch_size_sum{{{labels}}}"]) == 33
    batches = float(values[f"mservd_batch_size_count{{{labels}}}"])
    alone = float(values[f'mservd_batch_size_bucket{{le="1.0",{labels}}}'])
    assert alone < batches  # some batches held more than one request


def test_a_lone_request_does_not_wait_out_the_batch_delay(daemon) -> None:
    # echobatch waits up to 2 s for batch-mates, but only while a worker is busy
    answer = daemon.predict("echobatch", json={"value": "alone"})
    assert answer.status_code == 200
    assert answer.elapsed.total_seconds() < 2.0  # waiting out the delay takes 2 s at least
    assert answer.json()["batch_size"] == 1


def test_unknown_model_and_version_are_404(daemon) -> None:
    answer = daemon.predict("nope", json={})
    assert answer.status_code == 404
    assert answer.json() == {"code": 404, "type": "ModelNotFoundException",
                             "message": "Model not found: nope"}
    answer = daemon.predict("echo", "9.9", json={})
    assert answer.status_code == 404
    assert answer.json()["type"] == "ModelVersionNotFoundException"  # TorchServe's type
    assert answer.json()["message"] == "Model version: 9.9 does not exist for model: echo"


def test_unknown_route_and_wrong_method(daemon) -> None:
    answer = requests.get(daemon.url("inference", "/nowhere"), timeout=10)
    assert answer.status_code == 404 and answer.json()["code"] == 404
    # GET is a prediction, as in TorchServe; DELETE is none
    answer = requests.delete(daemon.url("inference", "/predictions/echo"), timeout=10,
                             headers={"Authorization": f"Bearer {daemon.key('inference')}"})
    assert answer.status_code == 405 and answer.json()["type"] == "MethodNotAllowedException"
    answer = daemon.manage("PATCH", "/models/echo")
    assert answer.status_code == 405


def test_bad_input_fails_only_its_own_request_in_a_batch(daemon) -> None:
    bodies = [[0.1] * 64 if i % 4 else [1, 2, 3] for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda b: daemon.predict("tiny", json=b), bodies))
    for body, answer in zip(bodies, answers):
        if len(body) == 3:
            assert answer.status_code == 400, answer.text
            assert answer.json()["code"] == 400
            assert "expected a JSON list of 64 numbers" in answer.json()["message"]
        else:
            assert answer.status_code == 200, answer.text
            assert len(answer.json()) == 10


def test_one_failing_request_in_the_echo_batch_fails_alone(daemon) -> None:
    answer = daemon.predict("echo", json={"fail": True})
    assert answer.status_code == 400
    assert answer.json() == {"code": 400, "type": "BadInput",
                             "message": "request 0 asked to fail"}


def test_a_handler_that_raises_is_a_500_naming_the_exception(daemon) -> None:
    answer = daemon.predict("echo", json={"raise": "boom from the handler"})
    assert answer.status_code == 500
    assert answer.json() == {"code": 500, "type": "InternalServerException",
                             "message": "ValueError: boom from the handler"}
    assert daemon.predict("echo", json={"after": 1}).status_code == 200
    assert "boom from the handler" in (daemon.log_dir / "model_echo.log").read_text()


def test_register_twice_is_a_conflict(daemon) -> None:
    answer = daemon.manage("POST", "/models", params={"url": "echo.mar"})
    assert answer.status_code == 409
    assert answer.json()["message"] == "Model version 1.0 is already registered for model echo"


def test_register_bad_parameters_are_400(daemon) -> None:
    answer = daemon.manage("POST", "/models")
    assert answer.status_code == 400 and "url is required" in answer.json()["message"]
    answer = daemon.manage("POST", "/models", params={"url": "../etc/passwd"})
    assert answer.status_code == 400 and "'..' is not allowed" in answer.json()["message"]
    answer = daemon.manage("POST", "/models", params={"url": "missing.mar"})
    assert answer.status_code == 404
    answer = daemon.manage("POST", "/models", params={"url": "tiny.mar", "batch_size": "x",
                                                      "model_name": "tiny2"})
    assert answer.status_code == 400 and "batch_size" in answer.json()["message"]


def test_scale_with_max_below_min_is_400(daemon) -> None:
    answer = daemon.manage("PUT", "/models/echo", params={"min_worker": 3, "max_worker": 1})
    assert answer.status_code == 400
    assert answer.json()["message"] == "max_worker (1) must be >= min_worker (3)."


def test_a_handler_that_fails_to_load_returns_its_traceback(daemon) -> None:
    answer = daemon.manage("POST", "/models", params={"url": "crash.mar"})
    assert answer.status_code == 500
    body = answer.json()
    assert body["message"].startswith("Failed to start workers for model crash version: 1.0")
    assert "weights are corrupt" in body["message"]
    assert "Traceback" in body["traceback"]
    assert daemon.manage("GET", "/models/crash").status_code == 404


def test_oversized_body_is_413(daemon) -> None:
    answer = daemon.predict("echo", data=b"x" * 6553501,
                            headers={"Content-Type": "application/octet-stream"})
    assert answer.status_code == 413
    assert answer.json()["type"] == "RequestEntityTooLarge"


def test_token_is_required_and_checked(daemon) -> None:
    url = daemon.url("inference", "/predictions/echo")
    answer = requests.post(url, json={}, timeout=10)
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"] == "Bearer"
    answer = requests.post(url, json={}, timeout=10, headers={"Authorization": "Bearer nope"})
    assert answer.status_code == 401
    wrong_api = requests.get(daemon.url("management", "/models"), timeout=10,
                             headers={"Authorization": f"Bearer {daemon.key('inference')}"})
    assert wrong_api.status_code == 401


def test_frontend_holds_512_concurrent_connections(daemon) -> None:
    """Every one of 512 simultaneous requests is answered on its connection: computed, or
    refused at once — by the controller because the model's queue (job_queue_size 100) is full,
    or at the frontend's door once the model's answers keep coming late — never dropped."""
    host, port = daemon.url("inference", "").removeprefix("http://").rsplit(":", 1)
    key = daemon.key("inference")
    body = b'{"value": 1}'
    request = (f"POST /predictions/echo HTTP/1.1\r\nHost: {host}\r\n"
               f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    sockets = []
    try:
        for _ in range(512):
            sock = socket.create_connection((host, int(port)), timeout=60)
            sockets.append(sock)
        for sock in sockets:
            sock.sendall(request)
        answers = []
        for sock in sockets:
            data = b""
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                chunk = sock.recv(4096)
                assert chunk, "connection closed before an answer"
                data += chunk
            status = data.split(b" ", 2)[1]
            answers.append((status, json.loads(data.split(b"\r\n\r\n", 1)[1])))
        assert {status for status, _ in answers} <= {b"200", b"503"}
        assert sum(status == b"200" for status, _ in answers) >= 100
        for status, doc in answers:
            if status == b"503":
                assert doc["type"] in ("QueueFullException", "ServiceUnavailableException"), doc
                assert doc["message"].endswith("retry later."), doc
            else:
                assert doc["echo"] == {"value": 1}
    finally:
        for sock in sockets:
            sock.close()


def test_requests_sent_in_one_message_share_a_batch_and_one_reply_and_a_bad_tail_spares_them(
        daemon) -> None:
    """The wire as the frontends coalesce it: every request of one event-loop turn in one
    PREDICT message. The controller queues them all before it dispatches, so an idle worker
    gets them as one batch whose answers come back in one REPLY, and a malformed request at
    the end drops only itself."""
    import json as _json

    import zmq
    from conftest import grpc_frontend

    from mservd import protocol

    grpc = grpc_frontend(daemon)
    endpoint = _json.loads(grpc.cmdline()[-1])["controller"]
    token = daemon.key("inference")

    def request(rid: bytes, payloads: list[bytes], inputs: int = 1) -> list[bytes]:
        return protocol.prediction(rid, "echobatch", None, token, protocol.CODEC_TORCHSERVE,
                                   [("body", "application/json")] * inputs, {}, payloads)

    good = [request(f"one-message-{i}".encode(), [_json.dumps({"n": i}).encode()])
            for i in range(3)]
    bad = request(b"one-message-bad", [b"{}"], inputs=2)  # announces 2 inputs, carries 1
    bad[1] = protocol.packb([*protocol.unpackb(bad[1])[:7], 2])
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(protocol.predictions([*good, bad]))
        assert sock.poll(30_000), "no answer"
        frames = sock.recv_multipart()  # one batch, one DONE: its answers in one REPLY
    finally:
        sock.close()
        ctx.term()
    assert frames[0] == protocol.REPLY
    answers = {r.rid: r for r in protocol.parse_results(frames[1:])}
    assert sorted(answers) == [f"one-message-{i}".encode() for i in range(3)]
    bodies = [_json.loads(answers[f"one-message-{i}".encode()].body) for i in range(3)]
    assert [b["echo"]["n"] for b in bodies] == [0, 1, 2]
    assert {b["batch_size"] for b in bodies} == {3}  # one batch, not three
    assert daemon.predict("echobatch", json={"still": "here"}).status_code == 200
