"""Metrics count exactly what was sent; logs tie lines to requests."""

from __future__ import annotations

import json
import re

import psutil
import requests
from conftest import controller_busy_during, wait_until


def test_metrics_count_a_known_mix_of_requests(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar"})
    for i in range(5):
        assert daemon.predict("echo", json={"i": i}).status_code == 200
    for _ in range(2):
        assert daemon.predict("echo", json={"fail": True}).status_code == 400
    assert daemon.predict("echo", json={"raise": "counted"}).status_code == 500
    for _ in range(2):
        assert daemon.predict("nope", json={}).status_code == 404

    labels = '{model_name="echo",model_version="1.0"}'

    def counted() -> dict[str, float]:  # a lent worker's answers count within 10 ms
        found = daemon.metrics()
        return found if found.get(f"ts_inference_requests_total{labels}") == 8 else {}

    m = wait_until(counted, 10, "the 8 echo requests counted", details=daemon.logs)
    assert (m["Requests2XX"], m["Requests4XX"], m["Requests5XX"]) == (5, 4, 1)
    assert m[f"mservd_request_latency_seconds_count{labels}"] == 8
    assert m[f"mservd_queue_latency_seconds_count{labels}"] == 8
    assert m[f"mservd_batch_size_count{labels}"] == 8
    assert m[f"mservd_batch_size_sum{labels}"] == 8
    assert m['mservd_request_latency_seconds_bucket{le="+Inf",model_name="echo",'
             'model_version="1.0"}'] == 8
    assert m[f"ts_inference_latency_microseconds{labels}"] > 0
    assert m[f"mservd_live_workers{labels}"] == 1
    assert m[f"mservd_pending_requests{labels}"] == 0
    [worker] = daemon.describe("echo")[0]["workers"]
    memory = f'mservd_worker_memory_bytes{{model_name="echo",model_version="1.0",' \
             f'worker_id="{worker["id"]}"}}'
    assert m[memory] > 10 * 2**20

    # the handler's own metric arrives within the worker's shipping interval
    def echo_requests() -> dict[str, float]:
        found = {k: v for k, v in daemon.metrics().items() if k.startswith("EchoRequests")}
        return found if sum(found.values()) >= 8 else {}

    custom = wait_until(echo_requests, 10, "the handler's EchoRequests metric to count 8",
                        details=daemon.logs)
    # a counter keeps its name, as TorchServe shows it (no _total)
    [(name, value)] = [(k, v) for k, v in custom.items() if k.startswith("EchoRequests{")]
    assert 'ModelName="echo"' in name and 'Purpose="test"' in name
    assert value == 8


def test_a_handler_gets_the_metrics_its_metrics_config_declares_as_in_torchserve(
        daemon_factory, store, tmp_path) -> None:
    from conftest import write_archive

    write_archive(store, "declared", "declared_metrics.py")
    config = tmp_path / "metrics.yaml"  # TorchServe's format; ts_metrics are its frontend's
    config.write_text("dimensions:\n  - &model_name ModelName\n"
                      "ts_metrics:\n  counter:\n    - name: Requests2XX\n      unit: Count\n"
                      "      dimensions: []\n"
                      "model_metrics:\n  counter:\n    - name: InferenceRequestCount\n"
                      "      unit: count\n      dimensions: []\n"
                      "  gauge:\n    - name: RequestBatchSize\n      unit: count\n"
                      "      dimensions: [*model_name]\n"
                      "    - name: HandlerTime\n      unit: ms\n"
                      "      dimensions: [*model_name, Level]\n")
    daemon = daemon_factory({"load_models": "declared.mar", "metrics_config": str(config)})
    mark = daemon.log_end("model_declared.log")
    for _ in range(3):
        answer = daemon.predict("declared", json={})
        assert answer.status_code == 200, answer.text  # before: KeyError, a 500

    def shipped() -> dict[str, float]:
        found = daemon.metrics()
        return found if any(k.startswith("InferenceRequestCount") for k in found) else {}

    found = wait_until(shipped, 10, "the handler's declared metrics", details=daemon.logs)
    assert found['RequestBatchSize{Level="Model",ModelName="declared"}'] == 1
    assert found['InferenceRequestCount{Level="Model",ModelName="declared"}'] == 3
    # a wrong update (one value for HandlerTime's two dimensions) is logged, not recorded
    assert not any(k.startswith("HandlerTime") and "too few" in k for k in found)
    daemon.wait_for_log("model_declared.log", "Metric 'HandlerTime' has dimensions", since=mark)


def test_metrics_keep_only_the_names_asked_for_as_torchserve_does(daemon_factory) -> None:
    import requests

    daemon = daemon_factory({"load_models": "echo.mar"})
    assert daemon.predict("echo", json={"i": 1}).status_code == 200
    url = daemon.url("metrics", "/metrics")
    text = requests.get(url, params={"name[]": ["ts_inference_requests_total", "Requests2XX"]},
                        timeout=10).text
    samples = {line.split("{")[0].split()[0] for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples == {"ts_inference_requests_total", "Requests2XX"}, text
    assert "# TYPE ts_inference_requests_total counter" in text
    everything = requests.get(url, timeout=10).text
    assert "mservd_request_latency_seconds_bucket" in everything  # no names: every sample


def test_model_log_tags_handler_output_with_pid_and_request_id(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar"})
    answer = daemon.predict("echo", json={"say": "hello-log"})
    rid = answer.headers["x-request-id"]
    [worker] = daemon.describe("echo")[0]["workers"]
    daemon.wait_for_log("model_echo.log", "hello-log")
    daemon.wait_for_log("access_log.log", rid)
    lines = daemon.read_log("model_echo.log").splitlines()
    [line] = [l for l in lines if "hello-log" in l]
    assert line.startswith(f"[pid {worker['pid']}] [requests {rid}] echo handled")

    access = (daemon.log_dir / "access_log.log").read_text()
    [entry] = [l for l in access.splitlines() if rid in l]
    assert re.search(r'"POST /predictions/echo HTTP/1.1" 200 \d+us ' + rid, entry)
    assert "127.0.0.1" in entry


def test_log_format_json_makes_every_process_log_json(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar", "log_format": "json"})
    answer = daemon.predict("echo", json={"say": "json-log"})
    rid = answer.headers["x-request-id"]
    daemon.wait_for_log("model_echo.log", "json-log")
    daemon.wait_for_log("access_log.log", rid)
    logs = daemon.log_dir
    records = {}
    for name in ("mservd.log", "model_echo.log", "frontend.log", "access_log.log"):
        lines = [line for line in (logs / name).read_text().splitlines() if line.startswith("{")]
        records[name] = [json.loads(line) for line in lines]
    assert any("ready" in r["message"] for r in records["model_echo.log"])  # the worker's
    assert any("HTTP frontends: gunicorn's arbiter" in r["message"]
               for r in records["frontend.log"])
    assert any(r["logger"] == "gunicorn.error" for r in records["frontend.log"])  # its own too
    assert all(line.startswith("{")
               for line in (logs / "frontend.log").read_text().splitlines() if line)
    assert any(r.get("request_id") == rid and r["status"] == 200
               for r in records["access_log.log"])
    assert records["mservd.log"] and all(r["level"] for r in records["mservd.log"])
    # a handler's print is a record too, tied to its request; nothing in the file is plain text
    model_lines = (logs / "model_echo.log").read_text().splitlines()
    assert len(records["model_echo.log"]) == len([line for line in model_lines if line])
    [printed] = [r for r in records["model_echo.log"] if "json-log" in r["message"]]
    assert printed["logger"] == "handler" and printed["level"] == "INFO"
    assert printed["requests"] == [rid]
    assert printed["message"].startswith(f"echo handled {rid}:")


def test_logs_past_log_max_bytes_are_rotated_while_their_writers_keep_writing(
        daemon_factory) -> None:
    """A stream of strangers' requests (401s) cannot fill the disk through the access log."""
    daemon = daemon_factory({"load_models": "echo.mar", "log_max_bytes": 20_000,
                             "log_backup_count": 2})
    logs = daemon.log_dir
    with requests.Session() as session:
        def refused_until_rotated() -> bool:
            for _ in range(100):  # ~100 bytes of access log each
                answer = session.post(daemon.url("inference", "/predictions/echo"), json={},
                                      headers={"Authorization": "Bearer wrong"}, timeout=10)
                assert answer.status_code == 401
            return (logs / "access_log.log.2").exists()

        wait_until(refused_until_rotated, timeout=60, what="access_log.log to rotate twice")
    assert not (logs / "access_log.log.3").exists()  # two copies kept
    assert (logs / "access_log.log.1").stat().st_size > 20_000
    # the HTTP workers hold the file open: their next lines land in the emptied file
    rid = daemon.predict("echo", json={"after": "rotation"}).headers["x-request-id"]
    daemon.wait_for_log("access_log.log", rid)
    assert (logs / "access_log.log").stat().st_size < 20_000 + 100 * 200
    assert "rotated access_log.log" in daemon.read_log("mservd.log")


def test_enable_metrics_api_false_serves_no_metrics_port(daemon_factory) -> None:
    import subprocess
    import sys

    daemon = daemon_factory({"load_models": "echo.mar", "enable_metrics_api": "false"})
    assert "metrics" not in daemon.state["addresses"]
    assert daemon.predict("echo", json={}).status_code == 200
    listening = {c.laddr.port for p in daemon.descendants()
                 for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    served = {int(daemon.url(api, "").rsplit(":", 1)[1]) for api in ("inference", "management")}
    served |= {int(daemon.grpc_address(api).rsplit(":", 1)[1])
               for api in ("inference", "management")}
    assert listening == served  # no third HTTP port
    shown = subprocess.run([sys.executable, "-m", "mservd", "metrics", "--log-dir",
                            str(daemon.log_dir)], capture_output=True, text=True, timeout=120,
                           check=False)
    assert shown.returncode != 0 and "enable_metrics_api=false" in shown.stderr
    status = subprocess.run([sys.executable, "-m", "mservd", "status", "--log-dir",
                             str(daemon.log_dir)], capture_output=True, text=True, timeout=120,
                            check=False)
    assert "metrics API:     off (enable_metrics_api=false)" in status.stdout, status.stderr


def test_a_flood_of_scrapes_holds_the_controller_a_small_share_of_its_time(
        daemon_factory) -> None:
    """The metrics port takes no token, and every prediction passes the controller: a
    stranger's scrapes, as fast as eight clients can send them, are each answered, while the
    controller renders for a small share of the time (each frontend spaces its renderings)."""
    import time

    daemon = daemon_factory({"load_models": "echo.mar"})
    assert daemon.predict("echo", json={}).status_code == 200
    url = daemon.url("metrics", "/metrics")
    answered, failed = [0], []

    def scrape(until: float) -> None:
        with requests.Session() as session:
            while time.monotonic() < until:
                reply = session.get(url, timeout=30)
                if reply.status_code == 200 and "ts_inference_requests_total" in reply.text:
                    answered[0] += 1
                else:
                    failed.append(reply.status_code)

    busy, seconds = controller_busy_during(daemon, [scrape] * 8, 4)
    assert not failed and answered[0] > 100
    assert busy < 0.25 * seconds, (busy, seconds, answered[0])
    assert daemon.predict("echo", json={}).status_code == 200
