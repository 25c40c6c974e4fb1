"""``mservd start | status | stop`` as a user runs them, and stopping under load."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from conftest import wait_until

ECHO = '{model_name="echo",model_version="1.0"}'


def mservd(*args: str, cwd: Path, timeout: float = 200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mservd", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_start_status_second_start_and_stop(tmp_path: Path, store: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("inference_address=http://127.0.0.1:0\n"
                      "management_address=http://127.0.0.1:0\n"
                      "metrics_address=http://127.0.0.1:0\n"
                      "grpc_inference_port=0\ngrpc_management_port=0\n"
                      "default_workers_per_model=1\nfrontend_workers=1\n")
    started = mservd("start", "--ts-config", str(config), "--model-store", str(store),
                     "--models", "echo=echo.mar", cwd=tmp_path)
    try:
        assert started.returncode == 0, started.stderr + started.stdout
        assert "inference API:" in started.stdout and "http://127.0.0.1:" in started.stdout
        state = json.loads((tmp_path / "logs" / "mservd.state.json").read_text())
        assert (tmp_path / "key_file.json").stat().st_mode & 0o777 == 0o600

        again = mservd("start", "--ts-config", str(config), "--model-store", str(store),
                       cwd=tmp_path)
        assert again.returncode != 0
        assert f"mservd is already running (pid {state['pid']})" in again.stderr

        status = mservd("status", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert "model echo 1.0 (default): 1 workers" in status.stdout
        workers = psutil.Process(state["pid"]).children(recursive=True)
    finally:
        stopped = mservd("stop", cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert f"mservd stopped (pid {state['pid']})" in stopped.stdout
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []
    assert mservd("status", cwd=tmp_path).returncode != 0
    assert not (tmp_path / "key_file.json").exists()  # its keys died with it, as TorchServe's


def test_start_reports_a_model_that_failed_to_load(tmp_path: Path, store: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("inference_address=http://127.0.0.1:0\n"
                      "management_address=http://127.0.0.1:0\n"
                      "metrics_address=http://127.0.0.1:0\n"
                      "grpc_inference_port=0\ngrpc_management_port=0\nfrontend_workers=1\n")
    started = mservd("start", "--ts-config", str(config), "--model-store", str(store),
                     "--models", "crash.mar", "--disable-token-auth", cwd=tmp_path)
    try:
        assert started.returncode == 0, started.stderr
        assert "model crash.mar failed to load: Failed to start workers for model crash" \
            in started.stderr
        assert "weights are corrupt" in started.stderr
    finally:
        assert mservd("stop", cwd=tmp_path).returncode == 0


def test_bad_configuration_stops_the_start_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("job_queue_size=lots\n")
    started = mservd("start", "--ts-config", str(config), "--foreground", cwd=tmp_path)
    assert started.returncode != 0
    assert "job_queue_size: 'lots' is not an integer" in started.stderr


def test_a_frontend_that_cannot_start_fails_the_start_with_its_reason(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("inference_address=http://127.0.0.1:0\n"
                      "management_address=http://127.0.0.1:0\n"
                      "metrics_address=http://127.0.0.1:0\n"
                      "grpc_inference_port=0\ngrpc_management_port=0\nfrontend_workers=2\n")
    (tmp_path / "logs" / "access_log.log").mkdir(parents=True)  # the frontends cannot open it
    started = mservd("start", "--ts-config", str(config), "--disable-token-auth", cwd=tmp_path,
                     timeout=120)
    assert started.returncode != 0
    assert "mservd cannot serve: the HTTP frontend" in started.stderr
    assert "exited as it started" in started.stderr
    assert "IsADirectoryError" in started.stderr  # from the end of frontend.log
    assert not (tmp_path / "logs" / "mservd.pid").exists()
    assert mservd("status", cwd=tmp_path).returncode != 0


def test_stop_while_requests_are_in_flight_answers_every_one(daemon_factory) -> None:
    daemon = daemon_factory({"load_models": "echo.mar", "default_workers_per_model": 2})

    def slow(i: int):
        return daemon.predict("echo", json={"sleep": 0.5, "i": i}, timeout=60)

    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(slow, i) for i in range(12)]
        wait_until(lambda: daemon.metrics().get(f"ts_inference_requests_total{ECHO}") == 12,
                   30, "all 12 requests to be accepted into echo's queue", details=daemon.logs)
        daemon.proc.send_signal(signal.SIGTERM)
        answers = [f.result() for f in futures]
    assert [a.status_code for a in answers] == [200] * 12
    assert sorted(a.json()["echo"]["i"] for a in answers) == list(range(12))
    assert daemon.stop() == 0
