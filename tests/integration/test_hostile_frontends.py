"""The frontends against strangers and faults (issue 45): a flood of strangers' tokens from one
address leaves health checks, scrapes and key holders served; the dashboard's cookie is a
session, never the management key; and a daemon killed with SIGKILL leaves no stream silent,
no frontend running and, by the next start, no run folder behind. Token auth stays on."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import threading
from pathlib import Path

import grpc
import psutil
import pytest
import requests

STRANGER = "127.0.0.2"  # loopback too: the strangers' own address, apart from the clients'


def flood_of_strangers(url: str, stop: threading.Event, statuses: dict[int, int],
                       connections: int = 200) -> None:
    """``connections`` keep-alive connections from STRANGER, each sending predictions with a
    new random bearer token as fast as they are answered, until ``stop``; statuses counted."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)

    async def stranger() -> None:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port,
                                                       local_addr=(STRANGER, 0))
        try:
            while not stop.is_set():
                writer.write(f"POST {parts.path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                             f"{secrets.token_hex(16)}\r\nContent-Length: 0\r\n\r\n".encode())
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                statuses[status] = statuses.get(status, 0) + 1
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
        except (ConnectionError, asyncio.IncompleteReadError):
            statuses[-1] = statuses.get(-1, 0) + 1  # the server closed it: counted
        finally:
            writer.close()

    async def all_of_them() -> None:
        await asyncio.gather(*(stranger() for _ in range(connections)))

    asyncio.run(all_of_them())


def test_strangers_tokens_leave_health_checks_scrapes_and_key_holders_served(
        daemon_factory) -> None:
    """200 connections from one address sending random bearer tokens: /ping,
    /v2/health/ready and /metrics each answer 200 every time (their questions wait in their
    own lanes), a key holder's first call from another address is served, and the strangers'
    address is held to its own few questions at once (503 past them). Before, the strangers'
    tokens filled the one queue of 64 questions: health checks answered 503 17 times in 18
    and a key holder's first call once in two."""
    daemon = daemon_factory({"load_models": "echo.mar,tiny.mar"})
    assert daemon.key("inference"), "token authorization must be on"
    stop, strangers = threading.Event(), {}
    flood = threading.Thread(target=flood_of_strangers, args=(
        daemon.url("inference", "/predictions/echo"), stop, strangers))
    flood.start()
    health: dict[str, list[int]] = {"/ping": [], "/v2/health/ready": [], "/metrics": []}
    first_calls: list[int] = []
    try:
        from conftest import wait_until

        wait_until(lambda: sum(strangers.values()) > 500, 60, "the strangers' flood to be "
                   "under way")
        with requests.Session() as probe:
            for n in range(30):
                for path, codes in health.items():
                    api = "metrics" if path == "/metrics" else "inference"
                    codes.append(probe.get(daemon.url(api, path), timeout=30).status_code)
                if n % 10 == 0:  # a key holder's first call: a new key, unknown to the frontend
                    first_calls.append(rotated_key_holders_first_call(daemon))
    finally:
        stop.set()
        flood.join()
    assert all(set(codes) == {200} for codes in health.values()), (health, strangers)
    assert first_calls == [200, 200, 200], (first_calls, strangers)
    assert strangers.get(401, 0) > 0 and strangers.get(503, 0) > 0, strangers
    assert set(strangers) <= {401, 503}, strangers
    assert daemon.predict("tiny", json=[0.0] * 64).status_code == 200


def rotated_key_holders_first_call(daemon) -> int:
    """Rotate the inference key (the API key's call) and make the first prediction with the
    new one: its token is unknown to the frontend, so it is asked about among the strangers'."""
    api_key = {"Authorization": f"Bearer {daemon.key('API')}"}
    rotated = requests.get(daemon.url("management", "/token?type=inference"), headers=api_key,
                           timeout=30)
    assert rotated.status_code == 200, rotated.text
    key = rotated.json()["key"]
    return requests.post(daemon.url("inference", "/predictions/echo"), json={"first": True},
                         headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code


def test_the_dashboards_cookie_is_a_session_that_logout_and_rotation_end(
        daemon_factory) -> None:
    """The login's cookie holds a random session id, never the management key; it opens the
    dashboard until its logout, or until the management key is rotated, and the management API
    does not take it for the key. Before, the cookie was the key itself."""
    daemon = daemon_factory({"load_models": "echo.mar"})
    key = daemon.key("management")

    def login() -> tuple[requests.Session, str]:
        session = requests.Session()
        answer = session.post(daemon.url("management", "/dashboard/login"), data={"key": key},
                              allow_redirects=False, timeout=30)
        assert answer.status_code == 303, answer.text
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Max-Age=" in cookie
        value = session.cookies["mservd_dashboard"]
        assert key not in cookie and value != key
        return session, value

    first, first_id = login()
    second, second_id = login()
    assert first_id != second_id  # random, one per login
    overview = daemon.url("management", "/dashboard/overview")
    assert first.get(overview, timeout=30).status_code == 200
    # the session is no management key: the management API refuses it
    as_key = requests.get(daemon.url("management", "/models"), timeout=30,
                          headers={"Authorization": f"Bearer {first_id}"})
    assert as_key.status_code == 401, as_key.text
    from mservd.frontends.grpc.generated import management_pb2, management_pb2_grpc

    with (grpc.insecure_channel(daemon.grpc_address("management")) as channel,
          pytest.raises(grpc.RpcError) as refused):  # nor does gRPC management
        management_pb2_grpc.ManagementAPIsServiceStub(channel).ListModels(
            management_pb2.ListModelsRequest(), timeout=30,
            metadata=(("authorization", f"Bearer {first_id}"),))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "opens the dashboard alone" in refused.value.details()
    # a cookie holding the key itself (the old cookie) opens nothing
    old = requests.get(overview, cookies={"mservd_dashboard": key}, timeout=30)
    assert old.status_code == 401
    logout = first.post(daemon.url("management", "/dashboard/logout"), timeout=30,
                        headers={"X-Mservd-Dashboard": "1"})
    assert logout.status_code == 200 and "Max-Age=0" in logout.headers["set-cookie"]
    stale = requests.get(overview, cookies={"mservd_dashboard": first_id}, timeout=30)
    assert stale.status_code == 401 and "session has ended" in stale.json()["message"]
    assert second.get(overview, timeout=30).status_code == 200  # another login's lives on
    rotated = requests.get(daemon.url("management", "/token?type=management"), timeout=30,
                           headers={"Authorization": f"Bearer {daemon.key('API')}"})
    assert rotated.status_code == 200, rotated.text
    ended = second.get(overview, timeout=30)
    assert ended.status_code == 401 and "session has ended" in ended.json()["message"]


TRICKLE = '''
import time

from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    for i in range(600):  # a part every 0.2 s for two minutes: longer than any test waits
        send_intermediate_predict_response([f"part{i} " for _ in data], context.request_ids,
                                           "Intermediate Prediction success", 200, context)
        time.sleep(0.2)
    return ["final" for _ in data]
'''


def grpc_stream(daemon, model: str):
    """A StreamPredictions call on ``model`` with the inference key: its channel and parts
    (each read waits at most 30 s)."""
    from mservd.frontends.grpc.generated import inference_pb2, inference_pb2_grpc

    channel = grpc.insecure_channel(daemon.grpc_address("inference"))
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    parts = stub.StreamPredictions(
        inference_pb2.PredictionsRequest(model_name=model, input={"data": b"go"}), timeout=60,
        metadata=(("authorization", f"Bearer {daemon.key('inference')}"),))
    return channel, parts


@pytest.fixture
def own_temp(monkeypatch):
    """A temp folder of the test's own for the daemons it starts (their run folders land
    there), short enough for their ipc:// socket paths."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="mh-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_daemons_frontends_end_their_streams_and_its_run_folder_goes_at_next_start(
        daemon_factory, store, tmp_path, own_temp) -> None:
    """SIGKILL the daemon mid-stream: the open streams end at once with a 503 error as their
    last part (a prediction's chunks, the dashboard's events, a gRPC stream's UNAVAILABLE; no
    silence, no bare cut), the
    HTTP and gRPC frontends exit, and the next start removes the run folder the killed daemon
    left. Before, the frontends drained for
    drain_timeout with the stream silent, it broke with no error, and the run folder stayed."""
    from conftest import grpc_frontend, http_arbiter, http_workers, wait_until, write_archive

    handler = tmp_path / "trickle.py"
    handler.write_text(TRICKLE)
    trickle_store = tmp_path / "store"
    trickle_store.mkdir()
    write_archive(trickle_store, "trickle", str(handler),  # a worker for each of two streams
                  config={"minWorkers": 2, "maxWorkers": 2})
    (trickle_store / "echo.mar").write_bytes((store / "echo.mar").read_bytes())
    # drain_timeout long: before, the frontends sat out all of it
    daemon = daemon_factory({"load_models": "trickle.mar", "drain_timeout": 120,
                             "model_store": str(trickle_store)}, name="killed")
    run_folders = list(own_temp.glob("mservd-*"))
    assert len(run_folders) == 1, run_folders
    frontends = [p for p in (http_arbiter(daemon), grpc_frontend(daemon), *http_workers(daemon))
                 if p is not None]
    assert len(frontends) >= 3, frontends
    stream = requests.post(daemon.url("inference", "/predictions/trickle"), stream=True,
                           timeout=30, headers=daemon._headers("inference", None), data=b"go")
    assert stream.status_code == 200
    parts = stream.iter_content(chunk_size=None)
    assert next(parts).startswith(b"part0")
    board = requests.get(daemon.url("management", "/dashboard/events"), stream=True, timeout=30,
                         headers=daemon._headers("management", None))
    events = board.iter_lines()
    assert next(events).startswith(b"data: {")
    channel, grpc_parts = grpc_stream(daemon, "trickle")
    assert next(grpc_parts).prediction.startswith(b"part0")
    os.kill(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait()
    rest = b"".join(parts)  # ends (no exception: a proper end of the chunked body)
    last = rest[rest.rfind(b"{"):]
    error = json.loads(last)
    assert error["code"] == 503 and "controller" in error["message"], rest[-300:]
    said = b"\n".join(events)  # the dashboard's stream too ends with an error event
    assert b"event: error" in said and b"controller" in said, said[-300:]
    with pytest.raises(grpc.RpcError) as ended:  # and a gRPC stream with UNAVAILABLE
        for _ in grpc_parts:
            pass
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
    assert "controller" in ended.value.details()
    channel.close()
    _gone, alive = psutil.wait_procs(frontends, timeout=60)
    assert not alive, f"frontends outlived their controller: {alive}"
    assert run_folders[0].exists()  # nothing could remove it: the next start does
    second = daemon_factory({"load_models": "echo.mar", "model_store": str(trickle_store)},
                            name="next")
    assert not run_folders[0].exists()
    assert len(list(own_temp.glob("mservd-*"))) == 1  # the live one's own, kept
    assert second.predict("echo", json={}).status_code == 200
    wait_until(lambda: "removed 1 run folders of daemons that are gone"
               in second.read_log("mservd.log"), 30, "the removal to be logged")
