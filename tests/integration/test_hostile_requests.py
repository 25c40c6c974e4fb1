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
        assert answer.json()["message"] == "The JSON body is nested too deeply to parse."
    assert daemon.worker_pids("echo") == pids
    assert daemon.predict("echo", json={"a": 1}).status_code == 200


def test_deeply_nested_json_is_400_naming_the_problem(daemon) -> None:
    answer = daemon.predict("echo", data=b"[" * 3000,
                            headers={"Content-Type": "application/json"})
    assert answer.status_code == 400
    assert answer.json()["message"] == "The JSON body is nested too deeply to parse."


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


# -- the HTTP wire: gunicorn's parser and limits, and FrontendProtocol's ----------------------

@pytest.fixture(scope="module")
def strict(tmp_path_factory, store):
    """A daemon with short HTTP deadlines and a small connection cap, so attacks show fast."""
    from conftest import Daemon

    daemon = Daemon(tmp_path_factory.mktemp("hostile-wire"), store,
                    {"load_models": "echo.mar", "frontend_header_timeout": 2,
                     "frontend_write_timeout": 2, "frontend_body_timeout": 2,
                     "frontend_connections": 20})
    daemon.start()
    yield daemon
    daemon.stop()


def connect(daemon, api: str = "inference"):
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(daemon.url(api, "/"))
    return socket.create_connection((url.hostname, url.port), timeout=30)


def read_head(sock) -> tuple[int, bytes]:
    """The status of the first answer on ``sock`` and what came with it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    return int(data.split(b" ", 2)[1]), data


def closed_by_server(sock, within: float) -> bool:
    import time

    sock.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def trickle(daemon, sock, seconds: int) -> None:
    """A byte a second on ``sock`` until the server hangs up, the model answering meanwhile.

    The pause is the attack's pace (a slow client), not a wait for the server."""
    import time

    for _ in range(seconds):
        time.sleep(1)
        assert daemon.predict("echo", json={"meanwhile": 1}).status_code == 200
        try:
            sock.sendall(b"a")
        except (BrokenPipeError, ConnectionResetError):
            return


def test_headers_past_64_kib_are_431_before_they_end(strict) -> None:
    with connect(strict) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n")
        for i in range(80):  # 80 KB of headers, each well under the per-field limit
            sock.sendall(b"X-H%d: %s\r\n" % (i, b"v" * 1000))
        # the head never ends: the 431 comes as the bytes pass 64 KiB
        status, data = read_head(sock)
    assert status == 431 and data.startswith(b"HTTP/1.1 431 Request Header Fields Too Large")
    assert b'"type": "RequestHeaderFieldsTooLarge"' in data


@pytest.mark.parametrize("size", [60_000, 65_371, 100_000, 127_806])
def test_a_body_read_with_its_head_is_not_counted_as_head(strict, size: int) -> None:
    """A request of 64-128 KB sent at once reached the frontend in one read with its head,
    and that read's body bytes were counted against the head's 64 KiB (a 431)."""
    body = b'"' + b"a" * (size - 2) + b'"'
    key = strict.key("inference").encode()
    with connect(strict) as sock:
        sock.sendall(b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s"
                     b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (key, len(body), body))
        status, data = read_head(sock)
    assert status == 200, data[:300]
    answer = strict.predict("echo", data=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and len(answer.json()["echo"]) == size - 2


def test_a_management_call_without_a_token_is_refused_before_its_body_is_read(strict) -> None:
    with connect(strict, "management") as sock:
        sock.sendall(b"POST /models?url=echo.mar HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 60000\r\n\r\n")  # the body never comes
        status, data = read_head(sock)
    assert status == 401, data[:300]  # not the 408 of a body waited for


def test_headers_trickled_past_the_deadline_get_408_and_the_connection_closes(strict) -> None:
    import time

    started = time.monotonic()
    with connect(strict) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nX-Slow: ")
        trickle(strict, sock, 3)  # a byte a second keeps no connection open past the deadline
        status, data = read_head(sock)
        assert closed_by_server(sock, 5)
    assert status == 408 and b'"code": 408' in data
    # the 2 s header deadline answers it (our socket would give up only after 30 s)
    assert time.monotonic() - started < 20


def test_an_inference_flood_leaves_management_and_metrics_answering(strict) -> None:
    import requests

    flood = [connect(strict) for _ in range(40)]  # twice the cap, all idle
    try:
        assert sum(closed_by_server(sock, 0.5) for sock in flood) >= 20  # past the cap: closed
        assert strict.manage("GET", "/models").status_code == 200
        assert requests.get(strict.url("metrics", "/metrics"), timeout=10).status_code == 200
    finally:
        for sock in flood:
            sock.close()
    assert requests.get(strict.url("inference", "/ping"), timeout=10).status_code == 200


def test_a_flood_of_silent_grpc_connections_is_capped_and_closed_at_the_deadline(
        strict) -> None:
    """The gRPC ports bound connections as the HTTP ports do: past frontend_connections one is
    closed at once, and one that never sends its HTTP/2 settings is closed at
    frontend_header_timeout (gRPC would hold it 120 s, and take any number)."""
    import socket
    import time

    import grpc
    from google.protobuf import empty_pb2

    from mservd.frontends.grpc.generated import inference_pb2_grpc

    host, port = strict.grpc_address("inference").rsplit(":", 1)
    flood = [socket.create_connection((host, int(port)), timeout=10) for _ in range(40)]
    try:
        from conftest import wait_until

        # twice the cap of 20: the rest closed at once, well within the deadline (2 s)
        wait_until(lambda: sum(closed_by_server(sock, 0.01) for sock in flood) >= 20, 1.5,
                   "the server to close the connections past its cap of 20")
        closed = [closed_by_server(sock, 0.01) for sock in flood]
        started = time.monotonic()
        assert all(closed_by_server(sock, 10) for sock, gone in zip(flood, closed) if not gone)
        assert time.monotonic() - started < 6  # the deadline is 2 s
    finally:
        for sock in flood:
            sock.close()
    with grpc.insecure_channel(strict.grpc_address("inference")) as channel:
        health = inference_pb2_grpc.InferenceAPIsServiceStub(channel).Ping(empty_pb2.Empty(),
                                                                           timeout=30)
    assert "Healthy" in health.health


def test_a_client_that_never_reads_is_closed_and_buffers_nothing_for_it(strict) -> None:
    import psutil
    from conftest import http_workers

    [worker] = http_workers(strict)
    before = worker.memory_info().rss
    with connect(strict) as sock:
        sock.setsockopt(__import__("socket").SOL_SOCKET, __import__("socket").SO_RCVBUF, 4096)
        request = b"GET /api-description HTTP/1.1\r\nHost: x\r\n\r\n"
        sock.settimeout(5)
        try:
            sock.sendall(request * 300)  # pipelined, and never read
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        port = sock.getsockname()[1]

        def still_open() -> bool:
            return any(c.raddr and c.raddr.port == port for c in worker.net_connections("tcp"))

        from conftest import wait_until

        wait_until(lambda: not still_open(), 15, "the server to give up on the reader")
    assert worker.memory_info().rss - before < 16 * 2**20
    assert psutil.pid_exists(worker.pid)


def test_a_chunked_trailer_does_not_authorize_a_request(strict) -> None:
    key = strict.key("inference")
    body = b'{"a": 1}'
    with connect(strict) as sock:
        sock.sendall(b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"%x\r\n%s\r\n0\r\nAuthorization: Bearer %s\r\n\r\n"
                     % (len(body), body, key.encode()))
        status, data = read_head(sock)
        while status == 400 and not data.endswith(b"}") and (chunk := sock.recv(65536)):
            data += chunk
    assert status in (400, 401)  # refused as a trailer, or as a request without a token
    if status == 400:  # the parser's message, whole: "%.*s" unformatted before
        assert data.endswith(b'"message": "Header field not allowed in trailer."}'), data


@pytest.mark.parametrize(("coding", "status"), [("gzip, chunked", 501), ("Chunked", 200)])
def test_a_body_in_a_transfer_coding_under_chunked_is_501_not_handed_on(strict, coding,
                                                                        status) -> None:
    import http.client
    import json
    from urllib.parse import urlsplit

    url = urlsplit(strict.url("inference", "/"))
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    # gunicorn undoes the chunking only: the handler would get the gzip stream as the body
    connection.request("POST", "/predictions/echo", body=iter([b'{"a": 1}']),
                       headers={"Transfer-Encoding": coding, "Content-Type": "application/json",
                                "Authorization": f"Bearer {strict.key('inference')}"},
                       encode_chunked=True)
    answer = connection.getresponse()
    doc = json.loads(answer.read())
    connection.close()
    assert answer.status == status
    if status == 501:
        assert doc["type"] == "NotImplemented" and "'gzip, chunked'" in doc["message"]


def test_an_absolute_form_target_is_served_as_its_path(strict) -> None:
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(strict.url("inference", "/"))
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    # RFC 9112 section 3.2.2: a server must accept the absolute form (proxies send it)
    connection.request("GET", f"http://{url.hostname}:{url.port}/ping")
    answer = connection.getresponse()
    assert answer.status == 200 and b"Healthy" in answer.read()
    connection.close()
    # the management API's Flask routes too
    url = urlsplit(strict.url("management", "/"))
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    connection.request("GET", f"http://{url.hostname}:{url.port}/models",
                       headers={"Authorization": f"Bearer {strict.key('management')}"})
    answer = connection.getresponse()
    assert answer.status == 200 and b'"echo"' in answer.read()
    connection.close()


def test_a_websocket_upgrade_is_answered_as_the_plain_request_it_also_is(strict) -> None:
    upgrade = (b"Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")
    for target, status, says in ((b"/ping", 200, b"Healthy"),
                                 (b"/chat", 404, b"ResourceNotFoundException")):
        with connect(strict) as sock:
            sock.sendall(b"GET %s HTTP/1.1\r\n%s\r\n" % (target, upgrade))
            answer, data = read_head(sock)
            while says not in data:  # before: 403 and no body, for every target
                chunk = sock.recv(65536)
                assert chunk, data
                data += chunk
        assert answer == status, data
    # the management API's Flask routes too (werkzeug took it for a WebSocket route: 405)
    token = b"Authorization: Bearer %s\r\n" % strict.key("management").encode()
    with connect(strict, "management") as sock:
        sock.sendall(b"GET /models HTTP/1.1\r\n%s%s\r\n" % (upgrade, token))
        answer, data = read_head(sock)
    assert answer == 200, data


def test_a_malformed_request_pipelined_behind_a_good_one_is_answered_after_it(strict) -> None:
    with connect(strict) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP AT ALL\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 ") < 2:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    first, second = data.split(b"HTTP/1.1 ")[1:3]
    assert first.startswith(b"200") and second.startswith(b"400")


def test_a_form_without_a_token_is_refused_unparsed_and_a_huge_one_with_it_is_400(daemon) -> None:
    import requests

    fields = b"&".join(b"f%d=v" % i for i in range(300_000))  # ~2.3 MB, 300k fields
    url = daemon.url("inference", "/predictions/echo")
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    stranger = requests.post(url, data=fields, headers=form, timeout=30)
    assert stranger.status_code == 401  # the controller checks the token; no one parsed it
    answer = daemon.predict("echo", data=fields, headers=form)
    assert answer.status_code == 400
    assert "300000 fields; at most 1000 are read" in answer.json()["message"]
    small = daemon.predict("echo", data=b"data=hello&other=1", headers=form)
    assert small.status_code == 200
    assert small.json()["echo"] == "hello"  # each field one input: echo answers "data"
    assert daemon.predict("echo", json={"still": "serving"}).status_code == 200


def test_kserve_v1_request_with_more_instances_than_the_cap_is_400(daemon) -> None:
    url = daemon.url("inference", "/v1/models/echo:predict")
    headers = daemon._headers("inference", None)
    flood = daemon.session.post(url, json={"instances": [{"n": i} for i in range(20_000)]},
                                headers=headers, timeout=60)
    assert flood.status_code == 400, flood.text
    assert "20000 instances; a request may carry at most 64" in flood.json()["error"]
    few = daemon.session.post(url, json={"instances": [{"n": 1}, {"n": 2}]}, headers=headers,
                              timeout=60)
    assert few.status_code == 200
    assert [p["echo"] for p in few.json()["predictions"]] == [{"n": 1}, {"n": 2}]


def test_worker_counts_are_capped_per_model_and_in_all(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar", "max_workers_per_model": 4,
                             "max_workers_total": 3}, args=("--enable-model-api",))
    too_many = daemon.manage("PUT", "/models/echo", params={"min_worker": 5})
    assert too_many.status_code == 400
    assert "max_workers_per_model (4)" in too_many.json()["message"]
    past_total = daemon.manage("PUT", "/models/echo", params={"min_worker": 4, "max_worker": 4})
    assert past_total.status_code == 400
    assert "max_workers_total (3)" in past_total.json()["message"]
    another = daemon.manage("POST", "/models", params={"url": "echo.mar", "model_name": "echo2",
                                                       "initial_workers": 3})
    assert another.status_code == 400, another.text
    assert "max_workers_total (3)" in another.json()["message"]
    huge = daemon.manage("POST", "/models", params={"url": "echo.mar", "model_name": "echo3",
                                                    "initial_workers": 9})
    assert huge.status_code == 400
    assert "max_workers_per_model (4)" in huge.json()["message"]
    assert len(daemon.describe("echo")[0]["workers"]) == 1  # nothing was forked for them
    fits = daemon.manage("PUT", "/models/echo", params={"min_worker": 3, "synchronous": "true"})
    assert fits.status_code == 200, fits.text


@pytest.mark.parametrize("authorization", [None, "Bearer not-the-key"])
def test_a_prediction_without_a_valid_token_is_refused_before_its_body_is_read(
        daemon, authorization) -> None:
    with connect(daemon) as sock:
        head = (b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/octet-stream\r\nContent-Length: 5000000\r\n")
        if authorization:
            head += b"Authorization: " + authorization.encode() + b"\r\n"
        sock.sendall(head + b"\r\n")  # and not a byte of the 5 MB body
        sock.settimeout(10)
        status, data = read_head(sock)
    assert status == 401
    assert b"WWW-Authenticate: Bearer" in data or b"www-authenticate: Bearer" in data


def test_a_body_announced_and_never_sent_gets_408_and_the_connection_closes(strict) -> None:
    with connect(strict) as sock:  # a client with the key: it passes the token check
        sock.sendall(b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + strict.key("inference").encode() + b"\r\n"
                     b"Content-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n")
        status, data = read_head(sock)  # the 2 s body deadline, long before our socket's 30 s
        assert closed_by_server(sock, 5)
    assert status == 408 and b'"type": "RequestTimeout"' in data


def test_a_body_trickled_past_its_deadline_gets_408_and_the_connection_closes(strict) -> None:
    import time

    started = time.monotonic()
    with connect(strict) as sock:
        sock.sendall(b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + strict.key("inference").encode() + b"\r\n"
                     b"Content-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n"
                     b"0123456789")
        trickle(strict, sock, 5)  # a byte a second: the rest would take 990 s
        status, data = read_head(sock)
        assert closed_by_server(sock, 5)
    assert status == 408 and b'"type": "RequestTimeout"' in data
    # the 2 s body deadline answers it (our socket would give up only after 30 s)
    assert time.monotonic() - started < 20


def test_bodies_held_at_once_are_bounded_and_past_the_bound_refused_before_being_read(
        daemon_factory) -> None:
    """With token auth off anyone may send bodies, each up to max_request_size and taking up
    to frontend_body_timeout: connections withholding the last byte of 6 MB bodies would each
    hold 6 MB of a frontend. A frontend holds at most frontend_body_bytes of bodies at once (a
    lone body always): past it a request is refused 503 before its body is read, and the
    bytes are given back once the held body is answered."""
    daemon = daemon_factory({"load_models": "echo.mar", "disable_token_authorization": "true",
                             "frontend_workers": 1, "frontend_body_bytes": 8 << 20})
    size = 6_000_000
    head = (b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % size)
    with connect(daemon) as holder:
        holder.sendall(head + b"x" * (size - 1))  # the last byte withheld
        for _ in range(5):
            with connect(daemon) as late:
                late.sendall(head)  # and not a byte of its body
                late.settimeout(10)
                status, data = read_head(late)
                assert status == 503, data
                assert b'"type": "ServiceUnavailableException"' in data, data
                assert b"frontend_body_bytes" in data and b"retry-after: 1" in data.lower(), data
        holder.sendall(b"x")
        holder.settimeout(30)
        status, data = read_head(holder)
        assert status == 200, data[:300]
        length = int(data.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        received = len(data.split(b"\r\n\r\n", 1)[1])
        while received < length:  # its answer read whole: the bytes are held until it is sent
            received += len(holder.recv(1 << 20))
    with connect(daemon) as after:  # the held body's bytes were given back
        after.sendall(head + b"y" * size)
        after.settimeout(30)
        status, data = read_head(after)
        assert status == 200, data[:300]
