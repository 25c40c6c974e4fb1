"""``mservd models ...`` and ``mservd metrics`` against a live daemon, run as a user runs them.

One daemon serves the whole module (its workers load torch, which is slow on a small machine),
so the tests run in file order: register → list → describe → scale → set-default → unregister.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ECHO_REGISTERED = 'Model "echo" Version: 1.0 registered with 1 initial workers'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    daemon = Daemon(tmp_path_factory.mktemp("client-commands"), store,
                    args=("--enable-model-api",))
    daemon.start()
    yield daemon
    daemon.stop()


def mservd(*args: str, daemon=None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``python -m mservd ARGS`` (with the daemon's ``--log-dir``) and capture its output."""
    argv = [sys.executable, "-m", "mservd", *args]
    if daemon is not None:
        argv += ["--log-dir", str(daemon.log_dir)]
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def progress(stderr: str) -> list[str]:
    return re.findall(r"^workers ready (\d+/\d+)", stderr, re.MULTILINE)


def test_models_list_says_when_nothing_is_registered(daemon) -> None:
    assert ok(mservd("models", "list", daemon=daemon)) == "No models are registered.\n"
    assert json.loads(ok(mservd("models", "list", "--json", daemon=daemon))) == {"models": []}


def test_register_synchronous_shows_progress_until_the_workers_are_ready(daemon) -> None:
    result = mservd("models", "register", "echo.mar", "--initial-workers", "1", daemon=daemon)
    assert ok(result) == ECHO_REGISTERED + "\n"
    steps = progress(result.stderr)  # echo may be ready by the first look: then 1/1 alone
    assert steps and steps[-1] == "1/1" and steps == sorted(steps), result.stderr
    assert "(echo 1.0, " in result.stderr
    [desc] = daemon.describe("echo")
    assert [w["status"] for w in desc["workers"]] == ["READY"]


def test_register_synchronous_shows_a_loading_worker_as_not_ready_yet(daemon) -> None:
    result = mservd("models", "register", "slowinit.mar", "--initial-workers", "1",
                    daemon=daemon)  # its handler takes 6 s to initialize
    ok(result)
    assert progress(result.stderr)[:1] == ["0/1"] and progress(result.stderr)[-1] == "1/1", \
        result.stderr
    ok(mservd("models", "unregister", "slowinit", daemon=daemon))  # the next tests see echo


def test_register_no_synchronous_prints_the_api_json(daemon) -> None:
    result = mservd("models", "register", "echo-2.0.mar", "--no-synchronous",
                    "--initial-workers", "0", "--batch-size", "4", "--max-batch-delay", "20",
                    "--json", daemon=daemon)
    assert json.loads(ok(result)) == {
        "status": 'Model "echo" Version: 2.0 registered with 0 initial workers. Use scale '
                  "workers API to add workers for the model."}
    assert progress(result.stderr) == []
    [desc] = daemon.describe("echo", "2.0")
    assert (desc["batchSize"], desc["maxBatchDelay"], desc["workers"]) == (4, 20, [])


def test_models_list_prints_name_default_version_and_url(daemon) -> None:
    lines = ok(mservd("models", "list", daemon=daemon)).splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["NAME", "DEFAULT VERSION", "URL"]
    assert [line.split() for line in lines[1:]] == [["echo", "1.0", "echo.mar"]]
    as_json = json.loads(ok(mservd("models", "list", "--json", daemon=daemon)))
    assert as_json == daemon.manage("GET", "/models").json()


def test_describe_prints_settings_and_a_worker_table(daemon) -> None:
    text = ok(mservd("models", "describe", "echo", daemon=daemon))
    [desc] = daemon.describe("echo")
    [worker] = desc["workers"]
    lines = text.splitlines()
    assert lines[0] == "echo 1.0 (default)"
    assert "  url:              echo.mar" in lines
    assert "  workers:          min 1, max 1" in lines
    assert "  batch size:       1" in lines
    assert any(line.startswith("  max batch delay:") and line.endswith(" ms") for line in lines)
    assert re.split(r"\s{2,}", lines[-2].strip()) == ["ID", "PID", "STATUS", "MEMORY MIB", "GPU"]
    row = lines[-1].split()
    assert row[:3] == [worker["id"], str(worker["pid"]), "READY"]
    assert int(row[3]) > 10 and row[4] == "-"

    both = ok(mservd("models", "describe", "echo", "all", daemon=daemon))
    blocks = both.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ["echo 1.0 (default)", "echo 2.0"]
    assert blocks[1].rstrip().endswith("no workers")

    as_json = json.loads(ok(mservd("models", "describe", "echo", "all", "--json", daemon=daemon)))
    assert [d["modelVersion"] for d in as_json] == ["1.0", "2.0"]
    assert as_json[0]["workers"][0]["pid"] == worker["pid"]
    assert set(as_json[0]) == set(desc)

    customized = ok(mservd("models", "describe", "echo", "--customized", daemon=daemon))
    [line] = [ln for ln in customized.splitlines() if ln.startswith("  handler metadata: ")]
    asked = json.loads(line.split(":", 1)[1])  # echo has no describe_handle: it answers the
    assert asked["echo"] is None and asked["batch_size"] == 1  # question as an empty request


def test_scale_synchronous_waits_for_the_new_worker(daemon) -> None:
    result = mservd("models", "scale", "echo", "--min-worker", "2", "--max-worker", "2",
                    "--synchronous", daemon=daemon)
    assert ok(result) == "Workers scaled to 2 for model: echo\n"
    assert progress(result.stderr)[-1] == "2/2", result.stderr
    [desc] = daemon.describe("echo")
    assert [w["status"] for w in desc["workers"]] == ["READY", "READY"]

    result = mservd("models", "scale", "echo", "1.0", "--min-worker", "1", "--json",
                    daemon=daemon)
    assert json.loads(ok(result)) == {"status": "Processing worker updates..."}


def test_set_default_and_unregister(daemon) -> None:
    result = mservd("models", "set-default", "echo", "2.0", daemon=daemon)
    assert ok(result) == 'Default version successfully updated for model "echo" to "2.0"\n'
    lines = ok(mservd("models", "list", daemon=daemon)).splitlines()
    assert lines[1].split() == ["echo", "2.0", "echo-2.0.mar"]

    refused = mservd("models", "unregister", "echo", "2.0", daemon=daemon)
    assert refused.returncode == 1
    assert refused.stderr.startswith("mservd: error: 403 InvalidModelVersionException: ")
    assert "default version" in refused.stderr

    assert ok(mservd("models", "unregister", "echo", "1.0", daemon=daemon)) == \
        'Model "echo" unregistered\n'
    result = mservd("models", "unregister", "echo", "--json", daemon=daemon)
    assert json.loads(ok(result)) == {"status": 'Model "echo" unregistered'}
    assert daemon.manage("GET", "/models").json() == {"models": []}


def test_register_of_a_failing_handler_exits_1_with_the_server_message(daemon) -> None:
    result = mservd("models", "register", "crash.mar", "--initial-workers", "1", daemon=daemon)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("mservd: error: 500 InternalServerException: Failed to start workers "
                           "for model crash version: 1.0: "), result.stderr
    assert "weights are corrupt (crash_on_init fixture)" in last
    assert progress(result.stderr)[0] == "0/1"
    # as a synchronous register on the server does, the failed model is removed
    assert daemon.manage("GET", "/models/crash").status_code == 404


def test_api_errors_print_code_type_and_message(daemon) -> None:
    result = mservd("models", "describe", "nope", daemon=daemon)
    assert result.returncode == 1
    assert result.stderr == "mservd: error: 404 ModelNotFoundException: Model not found: nope\n"

    result = mservd("models", "scale", "nope", "--min-worker", "1", daemon=daemon)
    assert result.returncode == 1
    assert result.stderr.startswith("mservd: error: 404 ModelNotFoundException: ")

    result = mservd("models", "register", "missing.mar", daemon=daemon)
    assert result.returncode == 1
    assert result.stderr == ("mservd: error: 404 ModelNotFoundException: Model not found in "
                             "model store: missing.mar\n")


def test_url_and_token_flags_override_the_state_file(daemon, tmp_path: Path) -> None:
    base = ["--log-dir", str(tmp_path / "no-daemon-here")]
    url = daemon.state["addresses"]["management"]
    result = mservd("models", "list", "--json", "--management-url", url,
                    "--token", daemon.key("management"), *base)
    assert json.loads(ok(result)) == {"models": []}

    wrong = mservd("models", "list", "--management-url", url, "--token", "not-the-key", *base)
    assert wrong.returncode == 1
    assert wrong.stderr.startswith("mservd: error: 401 Unauthorized: Token authorization failed")

    missing = mservd("models", "list", *base)
    assert missing.returncode == 1
    assert missing.stderr.startswith("mservd: error: mservd is not running with log folder ")

    metrics_url = daemon.state["addresses"]["metrics"]
    assert "# TYPE " in ok(mservd("metrics", "--metrics-url", metrics_url, *base))


def test_metrics_prints_prometheus_text_and_filters_by_name(daemon) -> None:
    text = ok(mservd("metrics", daemon=daemon))
    assert "# TYPE ts_inference_requests" in text
    assert "# TYPE ts_queue_latency_microseconds" in text
    only = ok(mservd("metrics", "ts_inference_requests_total", daemon=daemon)).splitlines()
    assert any(line.startswith("# TYPE ts_inference_requests") for line in only)
    assert only and all("ts_inference_requests" in line for line in only)
    assert not any("ts_queue_latency" in line for line in only)
