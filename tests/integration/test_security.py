"""Token auth and hostile input: refused with a clear 4xx, nothing written, still serving."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    hostile = tmp_path_factory.mktemp("hostile-store")
    for archive in ("echo.mar",):
        (hostile / archive).write_bytes((store / archive).read_bytes())
    _write_hostile_archives(hostile)
    workdir = tmp_path_factory.mktemp("security-daemon")
    daemon = Daemon(workdir, hostile, {"load_models": "echo.mar", "max_archive_bytes": 200000},
                    args=("--enable-model-api",))
    daemon.start()
    yield daemon
    daemon.stop()


MANIFEST = json.dumps({"runtime": "python", "model": {"modelName": "evil", "modelVersion": "1.0",
                                                      "handler": "h.py"}})


def _write_pax_bomb(path: Path) -> None:
    """A 64 KB .tar.gz whose first header declares a 64 MB pax header (zeros, which compress
    to nothing): tarfile would read all of it into memory before any check."""
    import gzip

    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = 64 << 20
    with gzip.open(path, "wb") as gz:
        gz.write(info.tobuf(format=tarfile.USTAR_FORMAT))
        for _ in range(64):
            gz.write(b"\0" * (1 << 20))


def _write_hostile_archives(store: Path) -> None:
    _write_pax_bomb(store / "paxbomb.tar.gz")
    with zipfile.ZipFile(store / "slip.mar", "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", MANIFEST)
        z.writestr("../../escaped.txt", "pwned")
    with zipfile.ZipFile(store / "link.mar", "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", MANIFEST)
        info = zipfile.ZipInfo("h.py")
        info.external_attr = (0o120777 << 16)
        z.writestr(info, "/etc/passwd")
    with zipfile.ZipFile(store / "big.mar", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("MAR-INF/MANIFEST.json", MANIFEST)
        z.writestr("weights.bin", b"\0" * 5_000_000)
    with zipfile.ZipFile(store / "yamlbomb.mar", "w") as z:  # "billion laughs", 43 M strings
        z.writestr("MAR-INF/MANIFEST.json", json.dumps(
            {"runtime": "python", "model": {"modelName": "evil", "modelVersion": "1.0",
                                            "handler": "h.py", "configFile": "config.yaml"}}))
        z.writestr("h.py", "")
        z.writestr("config.yaml", "".join(
            f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9) if n else 'lol'}]\n"
            for n in range(9)) + "minWorkers: *l8\n")
    with tarfile.open(store / "tarlink.tar.gz", "w:gz") as t:
        data = MANIFEST.encode()
        info = tarfile.TarInfo("MAR-INF/MANIFEST.json")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("h.py")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/shadow"
        t.addfile(link)


def rotate(daemon, kind: str, key: str | None = None) -> requests.Response:
    return requests.get(daemon.url("management", "/token"), params={"type": kind}, timeout=10,
                        headers={"Authorization": f"Bearer {key or daemon.key('API')}"})


def test_expired_token_is_refused_and_rotation_replaces_it(daemon_factory) -> None:
    """The real daemon checks expiry; keys that live 60 ms are expired as soon as it serves.

    What a rotated key does over its lifetime is in tests/unit/test_auth_keystore.py, with a
    fake clock: here a fresh key would expire again before a request could prove it works.
    """
    from conftest import wait_until

    daemon = daemon_factory({"load_models": "echo.mar", "token_expiration_min": 0.001})

    def refused() -> list[requests.Response]:  # a list: a 401 Response itself is falsy
        answer = daemon.predict("echo", json={"a": 1})
        return [answer] if answer.status_code == 401 else []

    [expired] = wait_until(refused, timeout=30, what="the inference key to expire")
    assert "expired" in expired.json()["message"]
    old = daemon.key("inference")
    rotated = rotate(daemon, "inference")  # the API key never expires
    assert rotated.status_code == 200, rotated.text
    assert rotated.json()["key"] == daemon.key("inference") != old
    stale = daemon.predict("echo", json={"a": 3}, headers={"Authorization": f"Bearer {old}"})
    assert stale.status_code == 401
    assert "not the inference key" in stale.json()["message"]
    assert rotate(daemon, "inference", key=daemon.key("inference")).status_code == 401
    assert rotate(daemon, "management").status_code == 200


def test_key_file_is_private(daemon) -> None:
    assert Path(daemon.state["key_file"]).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("url, wording", [
    ("slip.mar", "escape"),
    ("link.mar", "link"),
    ("tarlink.tar.gz", "link"),
    ("paxbomb.tar.gz", "pax header of 67108864 bytes"),
    ("big.mar", "max"),
    ("yamlbomb.mar", "values once its yaml aliases are expanded"),
    ("/etc/passwd", "outside the model store"),
    ("../echo.mar", "'..' is not allowed"),
    ("http://127.0.0.1:1/evil.mar", "is not allowed"),
])
def test_hostile_archives_and_urls_are_refused(daemon, url: str, wording: str) -> None:
    answer = daemon.manage("POST", "/models", params={"url": url, "model_name": "evil"})
    assert answer.status_code == 400, answer.text
    assert wording in answer.json()["message"].lower() or wording in answer.json()["message"]
    assert not (daemon.store.parent / "escaped.txt").exists()
    assert not (daemon.store.parent.parent / "escaped.txt").exists()
    assert daemon.manage("GET", "/models/evil").status_code == 404
    assert daemon.predict("echo", json={"still": "serving"}).status_code == 200


@pytest.mark.parametrize("name", ["..", "a/b", "%2e%2e", "bad name", ".hidden"])
def test_bad_model_names_are_refused(daemon, name: str) -> None:
    answer = daemon.manage("POST", "/models", params={"url": "echo.mar", "model_name": name})
    assert answer.status_code in (400, 404)
    assert answer.json()["code"] == answer.status_code


def test_malformed_multipart_is_400(daemon) -> None:
    answer = daemon.predict("echo", data=b"--xx\r\nnonsense",
                            headers={"Content-Type": "multipart/form-data; boundary=xx"})
    assert answer.status_code == 400
    assert "multipart" in answer.json()["message"]


ROUTES = [("inference", "POST", "/predictions/echo"), ("inference", "GET", "/ping"),
          ("inference", "POST", "/predictions/echo/1.0"), ("inference", "POST", "/nowhere"),
          ("management", "POST", "/models"), ("management", "GET", "/models/echo"),
          ("management", "PUT", "/models/echo"), ("management", "GET", "/models"),
          ("metrics", "GET", "/metrics")]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(ROUTES), body=st.binary(max_size=2048),
       content_type=st.sampled_from(["application/json", "multipart/form-data; boundary=b",
                                     "application/x-www-form-urlencoded", "text/plain",
                                     "image/png", ""]),
       query=st.dictionaries(st.sampled_from(["url", "min_worker", "limit", "x"]),
                             st.text(max_size=20), max_size=3))
def test_random_bytes_at_every_route_never_give_a_5xx(daemon, route, body, content_type,
                                                       query) -> None:
    api, method, path = route
    key = daemon.key("inference" if api == "inference" else "management")
    answer = requests.request(method, daemon.url(api, path), data=body, params=query,
                              headers={"Content-Type": content_type,
                                       "Authorization": f"Bearer {key}"}, timeout=30)
    if path == "/ping" and answer.json() == {"status": "Unhealthy"}:
        return  # its documented 500 while a scale call above starts workers (TorchServe's)
    assert answer.status_code < 500 or answer.status_code == 503, answer.text
    if answer.status_code >= 400:
        assert answer.json()["code"] == answer.status_code


def test_key_file_is_private_whatever_was_left_beside_it(tmp_path, store) -> None:
    import os

    from conftest import Daemon

    workdir = tmp_path / "d"
    workdir.mkdir()
    (workdir / "key_file.json.tmp").write_text("left by someone")
    os.chmod(workdir / "key_file.json.tmp", 0o644)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not a key file")
    (workdir / ".key_file.json.link").symlink_to(elsewhere)
    daemon = Daemon(workdir, store, {"load_models": ""})
    daemon.start()
    try:
        key_file = Path(daemon.state["key_file"])
        assert key_file.stat().st_mode & 0o777 == 0o600
        assert not key_file.is_symlink()
        assert elsewhere.read_text() == "not a key file"
        rotated = rotate(daemon, "inference")  # written again: still private
        assert rotated.status_code == 200
        assert key_file.stat().st_mode & 0o777 == 0o600
    finally:
        daemon.stop()


def test_downloads_follow_only_allowed_redirects_and_leave_nothing_when_they_fail(
        daemon_factory, tmp_path) -> None:
    import http.server
    import threading

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            if self.path == "/ok/to-internal.mar":  # allowed, but sends the client elsewhere
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{port}/internal/secret.mar")
                self.end_headers()
            elif self.path == "/ok/to-file.mar":
                self.send_response(302)
                self.send_header("Location", "file:///etc/passwd")
                self.end_headers()
            elif self.path == "/ok/not-an-archive.mar":
                body = b"this is not a model archive"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                hits.append(self.path)
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args) -> None:
            pass

    hits: list[str] = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = tmp_path / "download-store"
    store.mkdir()
    try:
        daemon = daemon_factory({"model_store": str(store), "load_models": "",
                                 "allowed_urls": rf"http://127\.0\.0\.1:{port}/ok/.*"},
                                args=("--enable-model-api",))
        for name, wording in [("to-internal.mar", "is not allowed"),
                              ("to-file.mar", "not allowed"),
                              ("not-an-archive.mar", "")]:
            answer = daemon.manage("POST", "/models",
                                   params={"url": f"http://127.0.0.1:{port}/ok/{name}"})
            assert answer.status_code == 400, answer.text
            assert wording in answer.json()["message"]
        assert hits == []  # the internal address was never fetched
        assert sorted(p.name for p in store.iterdir()) == []  # nothing left in the store
    finally:
        server.shutdown()


def test_the_controller_picks_the_key_by_verb_and_drops_malformed_frames(daemon) -> None:
    """A frontend's message cannot lend a verb a weaker key, and garbage on the controller's
    socket is dropped: the daemon goes on answering."""
    import json as _json

    import zmq
    from conftest import grpc_frontend

    from mservd import protocol

    grpc = grpc_frontend(daemon)
    endpoint = _json.loads(grpc.cmdline()[-1])["controller"]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        for garbage in ([protocol.MANAGE], [protocol.MANAGE, b"\xc1\xc1"],
                        [protocol.MANAGE, protocol.packb({"op": 1})],
                        [protocol.MANAGE, protocol.packb([1, 2, 3])], [b"nonsense", b"x"]):
            sock.send_multipart(garbage)
        claim = {"id": b"claim-1", "op": "unregister", "api": protocol.API_INFERENCE,
                 "token": daemon.key("inference"), "args": {"model": "echo", "version": None}}
        sock.send_multipart([protocol.MANAGE, protocol.packb(claim)])
        assert sock.poll(10_000), "no answer from the controller"
        frames = sock.recv_multipart()
        assert frames[:2] == [protocol.REPLY, b"claim-1"]
        assert protocol.Head.parse(frames[2]).status == 401  # unregister needs the management key
    finally:
        sock.close()
        ctx.term()
    assert daemon.predict("echo", json={"still": "here"}).status_code == 200
    assert daemon.manage("GET", "/models/echo").status_code == 200


def test_blacklist_env_vars_hides_matching_variables_from_the_workers(
        daemon_factory, monkeypatch) -> None:
    import psutil

    monkeypatch.setenv("MSERVD_TEST_SECRET_KEY", "s3cr3t")
    monkeypatch.setenv("MSERVD_TEST_SECRET", "kept: the name does not match all of the pattern")
    daemon = daemon_factory({"load_models": "echo.mar",
                             "blacklist_env_vars": "MSERVD_TEST_SECRET_.*|AWS_.*"})
    assert daemon.predict("echo", json={}).status_code == 200
    [pid] = daemon.worker_pids("echo")
    # what the worker was started with, as a handler reading /proc/self/environ would see it
    environ = psutil.Process(pid).environ()
    assert "MSERVD_TEST_SECRET_KEY" not in environ
    assert environ["MSERVD_TEST_SECRET"].startswith("kept")
    # nor any other process of the daemon's a handler could read: zygote, frontends
    for child in daemon.descendants():
        assert "MSERVD_TEST_SECRET_KEY" not in child.environ(), child.cmdline()[:3]
    # the daemon keeps it (it is made non-dumpable: root alone reads its /proc; tests are root)
    assert psutil.Process(daemon.proc.pid).environ()["MSERVD_TEST_SECRET_KEY"] == "s3cr3t"


def self_signed_certificate(folder) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, made by Debian's openssl."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def test_https_addresses_and_grpc_serve_tls_with_torchserves_certificate_keys(
        daemon_factory, tmp_path) -> None:
    import subprocess
    import sys

    import grpc
    import requests
    from google.protobuf import empty_pb2

    from mservd.frontends.grpc.generated import inference_pb2_grpc

    cert, key = self_signed_certificate(tmp_path)
    daemon = daemon_factory({"load_models": "echo.mar",
                             "inference_address": "https://127.0.0.1:0",
                             "management_address": "https://127.0.0.1:0",
                             "certificate_file": cert, "private_key_file": key,
                             "enable_grpc_ssl": "true"})
    assert daemon.url("inference", "").startswith("https://")
    assert daemon.url("metrics", "").startswith("http://")  # an http address stays plain
    # verify per call: requests lets REQUESTS_CA_BUNDLE override a session's own
    answer = daemon.predict("echo", json={"over": "tls"}, verify=cert)
    assert answer.status_code == 200 and answer.json()["echo"] == {"over": "tls"}
    assert daemon.manage("GET", "/models", verify=cert).json()["models"][0]["modelName"] \
        == "echo"
    with pytest.raises(requests.exceptions.SSLError):  # a client that does not trust it
        requests.get(daemon.url("inference", "/ping"), timeout=10)
    plain = daemon.url("inference", "/ping").replace("https://", "http://")
    with pytest.raises(requests.exceptions.ConnectionError):  # no plain HTTP on a TLS port
        requests.get(plain, timeout=10)
    assert daemon.metrics()["Requests2XX"] >= 1
    # the client commands trust the daemon's own certificate (from the state file)
    for command in (("models", "list"), ("status",)):
        shown = subprocess.run([sys.executable, "-m", "mservd", *command, "--log-dir",
                                str(daemon.log_dir)], capture_output=True, text=True, timeout=120,
                               check=False)
        assert shown.returncode == 0 and "echo" in shown.stdout, shown.stderr
    with open(cert, "rb") as handle:
        credentials = grpc.ssl_channel_credentials(handle.read())
    channel = grpc.secure_channel(daemon.grpc_address("inference"), credentials)
    health = inference_pb2_grpc.InferenceAPIsServiceStub(channel).Ping(empty_pb2.Empty(),
                                                                       timeout=30)
    assert "Healthy" in health.health
    channel.close()


@pytest.fixture(scope="module")
def tls_strict(tmp_path_factory, store):
    """An https:// inference port with a small connection cap and a short head deadline."""
    from conftest import Daemon

    workdir = tmp_path_factory.mktemp("tls-strict")
    cert, key = self_signed_certificate(workdir)
    daemon = Daemon(workdir, store, {"load_models": "echo.mar",
                                     "inference_address": "https://127.0.0.1:0",
                                     "certificate_file": cert, "private_key_file": key,
                                     "frontend_connections": 20, "frontend_header_timeout": 5})
    daemon.start()
    daemon.cert = cert
    yield daemon
    daemon.stop()


def tls_address(daemon) -> tuple[str, int]:
    from urllib.parse import urlsplit

    url = urlsplit(daemon.url("inference", "/"))
    return url.hostname, url.port


def hung_up(sock, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (0: already)."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except (TimeoutError, BlockingIOError):
        return False


def test_connections_in_their_tls_handshake_count_against_the_cap_and_its_deadline(
        tls_strict) -> None:
    """A stranger's TCP connections that never start (or never finish) a handshake are held
    within frontend_connections, like plain ones, and closed at the head's deadline."""
    import socket

    silent = [socket.create_connection(tls_address(tls_strict), timeout=10)
              for _ in range(40)]  # twice the cap, no handshake begun
    try:
        from conftest import wait_until

        # past the cap: closed before any handshake, well within the head's deadline (5 s)
        wait_until(lambda: sum(hung_up(sock, 0) for sock in silent) >= 20, 3,
                   "the server to close the connections past its cap of 20")
        closed = [hung_up(sock, 0) for sock in silent]
        held = [sock for sock, gone in zip(silent, closed) if not gone]
        assert all(hung_up(sock, 10) for sock in held)  # then at the deadline
    finally:
        for sock in silent:
            sock.close()
    # a half-sent hello is dropped at the same deadline; a real client is served beside it
    with socket.create_connection(tls_address(tls_strict), timeout=10) as stalled:
        stalled.sendall(b"\x16\x03\x01\x02\x00")  # a handshake record's header, no body
        answer = tls_strict.predict("echo", json={"over": "tls"}, verify=tls_strict.cert)
        assert answer.status_code == 200 and answer.json()["echo"] == {"over": "tls"}
        assert hung_up(stalled, 10)


def test_a_tls_client_that_never_answers_the_close_is_dropped_at_the_heads_deadline(
        tls_strict) -> None:
    """After an answer with ``Connection: close`` the server waits for the client's TLS
    goodbye as long as for a silent client's head (asyncio would wait 30 s): meanwhile the
    connection holds a place under the cap."""
    import socket
    import ssl
    import time

    from conftest import http_workers, wait_until

    context = ssl.create_default_context(cafile=tls_strict.cert)
    tls_strict.session.close()  # its kept-alive connection would take a place under the cap
    port = tls_address(tls_strict)[1]

    def places_taken() -> int:
        return sum(1 for worker in http_workers(tls_strict)
                   for c in worker.net_connections("tcp")
                   if c.laddr and c.laddr.port == port and c.status != "LISTEN")

    wait_until(lambda: places_taken() == 0, 15, "the server to let the session's connection go")
    closing = []
    try:
        for _ in range(20):  # the cap
            sock = context.wrap_socket(socket.create_connection(tls_address(tls_strict),
                                                                timeout=10),
                                       server_hostname="127.0.0.1")
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while not answer.endswith(b"}\n") and not answer.endswith(b"}"):
                answer += sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            # keep the TCP socket, and never send the TLS goodbye the server waits for
            closing.append(socket.socket(fileno=sock.detach()))
        started = time.monotonic()
        with socket.create_connection(tls_address(tls_strict), timeout=10) as late:
            assert hung_up(late, 1)  # the closing ones still hold the cap
        assert all(hung_up(sock, 10) for sock in closing)
        assert time.monotonic() - started < 10  # the head's deadline is 5 s, not 30
    finally:
        for sock in closing:
            sock.close()
    answer = tls_strict.predict("echo", json={"after": "the close"}, verify=tls_strict.cert)
    assert answer.status_code == 200


def test_an_https_address_without_certificate_files_fails_the_start_saying_so(
        tmp_path, store) -> None:
    import subprocess
    import sys

    config = tmp_path / "config.properties"
    config.write_text("inference_address=https://127.0.0.1:0\n"
                      "management_address=http://127.0.0.1:0\n"
                      "metrics_address=http://127.0.0.1:0\ngrpc_inference_port=0\n"
                      "grpc_management_port=0\nkeystore=keystore.p12\n")
    started = subprocess.run(
        [sys.executable, "-m", "mservd", "start", "--foreground", "--ts-config", str(config),
         "--log-dir", str(tmp_path / "logs"), "--model-store", str(store)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert started.returncode != 0
    assert "inference_address needs certificate_file and private_key_file" in started.stderr
    assert "keystore" in started.stderr


def test_cors_settings_answer_a_browsers_preflight_and_mark_every_answer(
        daemon_factory) -> None:
    import requests

    daemon = daemon_factory({"load_models": "echo.mar",
                             "cors_allowed_origin": "https://app.example",
                             "cors_allowed_methods": "GET, POST, OPTIONS",
                             "cors_allowed_headers": "Authorization, Content-Type"})
    expected = {"access-control-allow-origin": "https://app.example",
                "access-control-allow-methods": "GET, POST, OPTIONS",
                "access-control-allow-headers": "Authorization, Content-Type"}

    def cors(answer) -> dict[str, str]:
        return {k.lower(): v for k, v in answer.headers.items()
                if k.lower().startswith("access-control-")}

    # a browser's preflight carries no token: answered before any check
    preflight = requests.options(daemon.url("inference", "/predictions/echo"), timeout=10,
                                 headers={"Origin": "https://app.example",
                                          "Access-Control-Request-Method": "POST",
                                          "Access-Control-Request-Headers": "authorization"})
    assert preflight.status_code == 200 and cors(preflight) == expected
    answer = daemon.predict("echo", json={"from": "a page"}, headers={"Origin": "https://x"})
    assert answer.status_code == 200 and cors(answer) == expected
    refused = requests.post(daemon.url("inference", "/predictions/echo"), json={}, timeout=10)
    assert refused.status_code == 401 and cors(refused) == expected  # the page can read why
    assert cors(daemon.manage("GET", "/models")) == expected
    # the parser's own refusals carry them too (a head past its bounds: 431)
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(daemon.url("inference", "/"))
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head and (chunk := sock.recv(65536)):
            head += chunk
    assert head.startswith(b"HTTP/1.1 431") and \
        b"Access-Control-Allow-Origin: https://app.example" in head, head
    # OPTIONS / without a preflight's header is still the API description
    described = requests.options(daemon.url("inference", "/"), timeout=10)
    assert described.status_code == 200 and "openapi" in described.json()


def test_without_cors_settings_no_answer_allows_another_origin(daemon) -> None:
    import requests

    answer = requests.get(daemon.url("inference", "/ping"), timeout=10,
                          headers={"Origin": "https://evil.example"})
    assert not any(k.lower().startswith("access-control-") for k in answer.headers)


def pipelined_flood(daemon, api: str, request: Callable[[int], bytes],
                    statuses: dict[bytes, int]) -> Callable[[float], None]:
    """A stranger on one connection to ``api``'s port: 50 requests (``request(n)``) sent at
    once, their answers read, again until the deadline; the statuses counted."""
    import socket
    import time
    from urllib.parse import urlsplit

    url = urlsplit(daemon.url(api, "/"))

    def flood(until: float) -> None:
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            while time.monotonic() < until:
                sock.sendall(b"".join(request(n) for n in range(50)))
                data = b""
                while data.count(b"HTTP/1.1 ") < 50 or not data.endswith((b"}", b"}\n")):
                    chunk = sock.recv(65536)
                    assert chunk, "the server closed a stranger's connection"
                    data += chunk
                for head in data.split(b"HTTP/1.1 ")[1:]:
                    status = head[:3]
                    statuses[status] = statuses.get(status, 0) + 1

    return flood


def a_strangers_token(verb: str, path: str) -> bytes:
    import secrets

    return (f"{verb} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            f"{secrets.token_hex(8)}\r\nContent-Length: 0\r\n\r\n").encode()


def test_a_strangers_flood_of_pings_and_bad_tokens_leaves_the_controller_to_the_clients(
        daemon_factory) -> None:
    """Pings and the check of a stranger's token are questions anyone may make the controller
    answer, ~150 µs each. Pipelined as fast as four connections can send them, they hold the
    controller a small share of its time (each frontend spaces them); each is answered (a
    stranger's token 401, or 503 while 64 others wait), and a key holder is served
    throughout."""
    import time

    from conftest import controller_busy_during

    daemon = daemon_factory({"load_models": "echo.mar"})
    statuses: dict[bytes, int] = {}
    served = []
    flood = pipelined_flood(daemon, "inference", lambda n: (
        b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n" if n % 2
        else a_strangers_token("POST", "/predictions/echo")), statuses)

    def client(until: float) -> None:
        while time.monotonic() < until:
            served.append(daemon.predict("echo", json={"from": "a client"}).status_code)

    busy, seconds = controller_busy_during(daemon, [flood] * 4 + [client], 4)
    assert set(statuses) <= {b"200", b"401", b"503"}, statuses
    # every connection's first 50 at least, answered (how many more the 4 s hold is the
    # box's speed at that moment: CI saw exactly 200, once, of a flood spaced by design)
    assert sum(statuses.values()) >= 200 and statuses.get(b"401", 0) > 0, statuses
    assert served and set(served) == {200}
    assert busy < 0.2 * seconds, (busy, seconds, statuses, len(served))


def test_a_strangers_flood_of_management_calls_leaves_the_controller_to_the_admin(
        daemon_factory) -> None:
    """Every management call needs the management key, and a stranger's is asked about as
    any unknown token is (spaced, per frontend process), not sent on as the call; a key
    rotation, which checks the API key itself, is such a question too. Management calls,
    dashboard documents and rotations with random keys, pipelined on four connections, hold
    the controller a small share of its time, and the admin's calls are answered throughout
    (measured without the rotations: before, each call was sent on to the controller, 24 % of
    its time against 13 % after, and the admin got 381 answers against 709)."""
    import time

    from conftest import controller_busy_during

    daemon = daemon_factory({"load_models": "echo.mar"})
    statuses: dict[bytes, int] = {}
    served = []
    paths = ("/models", "/models/echo", "/dashboard/overview", "/token?type=management")
    flood = pipelined_flood(daemon, "management",
                            lambda n: a_strangers_token("GET", paths[n % 4]), statuses)
    admin = {"Authorization": f"Bearer {daemon.key('management')}"}

    def client(until: float) -> None:
        while time.monotonic() < until:
            served.append(requests.get(daemon.url("management", "/models/echo"),
                                       headers=admin, timeout=30).status_code)

    busy, seconds = controller_busy_during(daemon, [flood] * 4 + [client], 4)
    assert set(statuses) <= {b"401", b"503"}, statuses
    # every connection's first 50 at least, answered (how many more the 4 s hold is the
    # box's speed at that moment: CI saw exactly 200, once, of a flood spaced by design)
    assert sum(statuses.values()) >= 200 and statuses.get(b"401", 0) > 0, statuses
    assert served and set(served) == {200}
    assert busy < 0.2 * seconds, (busy, seconds, statuses, len(served))
