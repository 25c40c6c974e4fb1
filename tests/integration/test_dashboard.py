"""The live dashboard (GET /dashboard on the management port): its key, its overview document
for scripts, and the page itself driven in a real headless Chromium (Debian's package, through
Playwright, no browser downloaded)."""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import time

import pytest
import requests

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    daemon = Daemon(tmp_path_factory.mktemp("dashboard"), store,
                    {"load_models": "tiny.mar,echo.mar", "max_workers_per_model": 3})
    daemon.start()
    yield daemon
    daemon.stop()


def management(daemon, path: str) -> str:
    return daemon.url("management", path)


def test_the_page_its_stream_and_its_document_need_the_management_key(daemon) -> None:
    page = requests.get(management(daemon, "/dashboard"), timeout=10)
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    assert 'name="key"' in page.text and "tiny" not in page.text
    with_inference_key = requests.get(management(daemon, "/dashboard"), timeout=10, headers={
        "Authorization": f"Bearer {daemon.key('inference')}"})
    assert with_inference_key.status_code == 401 and 'name="key"' in with_inference_key.text
    for path in ("/dashboard/events", "/dashboard/overview"):
        refused = requests.get(management(daemon, path), timeout=10)
        assert refused.status_code == 401, path
        assert refused.json()["type"] == "Unauthorized"
        inference_key = {"Authorization": f"Bearer {daemon.key('inference')}"}
        assert requests.get(management(daemon, path), headers=inference_key,
                            timeout=10).status_code == 401
    wrong = requests.post(management(daemon, "/dashboard/login"), data={"key": "nope"},
                          allow_redirects=False, timeout=10)
    assert wrong.status_code == 401 and "refused" in wrong.text


def test_the_overview_document_describes_each_model_for_scripts(daemon) -> None:
    assert daemon.predict("tiny", json=[0.0] * 64).status_code == 200
    answer = daemon.manage("GET", "/dashboard/overview")
    assert answer.status_code == 200
    doc = answer.json()
    assert doc["uptimeSeconds"] > 0 and set(doc["frontends"]) == {"http", "grpc"}
    tiny = next(m for m in doc["models"] if m["name"] == "tiny")
    assert tiny["state"] == "READY" and tiny["isDefault"] and not tiny["generative"]
    assert tiny["answers"]["200"] >= 1 and tiny["latency"]["count"] >= 1
    assert tiny["workers"][0]["pid"] in daemon.worker_pids("tiny")
    assert tiny["workers"][0]["memoryBytes"] > 0 and tiny["workers"][0]["device"] == "cpu"
    assert tiny["queue"] == {"pending": 0, "capacity": tiny["queue"]["capacity"],
                             "oldestWaitSeconds": 0.0}


def test_a_refusal_shows_in_the_recent_events_with_its_request_id(daemon) -> None:
    refused = daemon.predict("tiny", version="9.9", json=[0.0] * 64)
    assert refused.status_code == 404
    events = daemon.manage("GET", "/dashboard/overview").json()["events"]
    assert any(e["kind"] == "refused" and e["rid"] == refused.headers["x-request-id"]
               for e in events), events


def test_an_action_sent_with_the_cookie_needs_the_dashboards_header(daemon) -> None:
    session = requests.Session()
    login = session.post(management(daemon, "/dashboard/login"),
                         data={"key": daemon.key("management")}, allow_redirects=False,
                         timeout=10)
    assert login.status_code == 303 and "HttpOnly" in login.headers["set-cookie"]
    assert "SameSite=Strict" in login.headers["set-cookie"]
    assert session.get(management(daemon, "/dashboard"), timeout=10).status_code == 200
    body = {"model": "echo", "min_worker": 1}
    forged = session.post(management(daemon, "/dashboard/actions/scale"), json=body, timeout=10)
    assert forged.status_code == 401
    done = session.post(management(daemon, "/dashboard/actions/scale"), json=body, timeout=10,
                        headers={"X-Mservd-Dashboard": "1"})
    assert done.status_code == 202, done.text
    too_many = session.post(management(daemon, "/dashboard/actions/scale"), timeout=10,
                            json={"model": "echo", "min_worker": 99},
                            headers={"X-Mservd-Dashboard": "1"})
    assert too_many.status_code == 400 and "max_workers_per_model" in too_many.json()["message"]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install "
                                              "chromium; .ci/run installs it)")
def test_the_page_in_a_browser_shows_models_live_and_scales_them(daemon, tmp_path) -> None:
    from conftest import wait_until
    from playwright.sync_api import expect, sync_playwright

    problems: list[str] = []
    stop = threading.Event()

    def load() -> None:  # a short closed loop on tiny while the page watches
        session = requests.Session()
        headers = {"Authorization": f"Bearer {daemon.key('inference')}"}
        url = daemon.url("inference", "/predictions/tiny")
        end = time.monotonic() + 60  # longer than the waits below add up to; stopped at their end
        while not stop.is_set() and time.monotonic() < end:
            session.post(url, json=[0.5] * 64, headers=headers, timeout=10)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                             args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(management(daemon, "/dashboard"))
            page.fill("input[name=key]", daemon.key("management"))
            page.click("button")
            problems.clear()  # the 401 of the key form itself is logged as a console error
            tiny = page.locator("article[data-model=tiny]")
            expect(tiny).to_be_visible(timeout=15000)
            expect(page.locator("#live")).to_have_text("live", timeout=10000)
            expect(page.locator("article[data-model=echo]")).to_be_visible()

            loader = threading.Thread(target=load)
            loader.start()
            try:
                rate = tiny.locator(".stat", has_text="requests/s").locator("span").nth(1)
                wait_until(lambda: float(rate.inner_text().replace(",", "") or 0) > 0, 15,
                           "requests/s on the page to show the load")
                first = tiny.locator(".legend").first.inner_text()
                wait_until(lambda: tiny.locator(".legend").first.inner_text() != first, 10,
                           "the latency figures to change")
            finally:
                stop.set()
                loader.join()

            tiny.locator(".workers-input").fill("2")
            tiny.locator("button.scale").click()
            expect(tiny.locator(".result")).to_contain_text("Processing", timeout=10000)
            wait_until(lambda: len(daemon.describe("tiny")[0]["workers"]) == 2, 60,
                       "tiny to have 2 workers")
            expect(tiny.locator("table.workers tbody tr")).to_have_count(2, timeout=10000)
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            print(f"screenshot: {tmp_path / 'dashboard.png'}")
        finally:
            browser.close()
    assert problems == []
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    daemon.manage("PUT", "/models/tiny", params={"min_worker": 1})


def test_the_event_stream_sends_a_document_a_second(daemon) -> None:
    headers = {"Authorization": f"Bearer {daemon.key('management')}"}
    with requests.get(management(daemon, "/dashboard/events"), headers=headers, stream=True,
                      timeout=10) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        documents = []
        for line in answer.iter_lines():
            if line.startswith(b"data: "):
                documents.append(json.loads(line[6:]))
            if len(documents) == 3:
                break
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(documents)]
    assert all(gap >= 0.9 for gap in gaps), gaps  # paced by the server, not by the reader
