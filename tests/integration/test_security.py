"""Token auth and hostile input: refused with a clear 4xx, nothing written, still serving."""

from __future__ import annotations

import io
import json
import tarfile
import time
import zipfile
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


def _write_hostile_archives(store: Path) -> None:
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


def test_expired_token_is_refused_until_rotated(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar", "token_expiration_min": 0.05})
    assert rotate(daemon, "inference").status_code == 200  # a fresh 3-second key
    assert daemon.predict("echo", json={"a": 1}).status_code == 200
    time.sleep(3.2)
    expired = daemon.predict("echo", json={"a": 1})
    assert expired.status_code == 401
    assert "expired" in expired.json()["message"]
    old = daemon.key("inference")
    rotated = rotate(daemon, "inference")
    assert rotated.status_code == 200, rotated.text
    assert rotated.json()["key"] == daemon.key("inference") != old
    assert daemon.predict("echo", json={"a": 2}).status_code == 200
    stale = daemon.predict("echo", json={"a": 3}, headers={"Authorization": f"Bearer {old}"})
    assert stale.status_code == 401
    assert rotate(daemon, "inference", key=daemon.key("inference")).status_code == 401
    assert rotate(daemon, "management").status_code == 200
    assert daemon.manage("GET", "/models").status_code == 200


def test_key_file_is_private(daemon) -> None:
    assert Path(daemon.state["key_file"]).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("url, wording", [
    ("slip.mar", "escape"),
    ("link.mar", "link"),
    ("tarlink.tar.gz", "link"),
    ("big.mar", "max"),
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
    assert answer.status_code < 500 or answer.status_code == 503, answer.text
    if answer.status_code >= 400:
        assert answer.json()["code"] == answer.status_code
