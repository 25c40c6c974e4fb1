"""Workflows (issue 49) on the real daemon: .war files built by the real torch-workflow-archiver,
registered over the management API, run by /wfpredict; each node a model of its own."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, wait_until, write_archive

_spec = importlib.util.spec_from_file_location(
    "workflow_archives", REPO / "tests" / "fixtures" / "workflows" / "archive.py")
workflow_archives = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workflow_archives)

ROW = [float(i % 7) - 3.0 for i in range(64)]
MODEL_API = {"enable_model_api": "true"}


@pytest.fixture(scope="module")
def wars(store: Path) -> Path:
    """The test workflows' .war files, in the model store (the default workflow store)."""
    workflow_archives.write_workflow_archive(store, "tiny_pair")
    workflow_archives.write_workflow_archive(store, "echo_chain")
    return store


def register(daemon, url: str, **params):
    return daemon.manage("POST", "/workflows", params={"url": url, **params}, timeout=180)


def wfpredict(daemon, name: str, headers=None, timeout=60, **kwargs):
    return daemon.session.post(daemon.url("inference", f"/wfpredict/{name}"),
                               headers=headers or {}, timeout=timeout, **kwargs)


@pytest.fixture
def pair(daemon_factory, wars):
    daemon = daemon_factory(MODEL_API, args=("--disable-token-auth",))
    answer = register(daemon, "tiny_pair.war")
    assert answer.status_code == 200, answer.text + daemon.logs()
    assert answer.json() == {"status": "Workflow tiny_pair has been registered and scaled "
                                       "successfully."}
    return daemon


def in_process(row: list[float]) -> list[float]:
    """The same steps without mservd: pre and aggregate imported from the workflow's handler,
    tiny through run-handler's path."""
    from mservd.cli.run_handler import Input, PhaseClock, run_batch

    spec = importlib.util.spec_from_file_location(
        "tiny_pair_handler", REPO / "tests" / "fixtures" / "workflows" / "tiny_pair" /
        "handler.py")
    handler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(handler)
    scaled = handler.pre([{"body": row}], None)[0]
    tiny = run_batch(REPO / "model_store" / "tiny.mar",
                     [Input("json", "application/json", scaled.encode())], PhaseClock())
    out = tiny.outputs[0]["body"].encode()
    return json.loads(handler.aggregate([{"left": out, "right": out}], None)[0])


def test_tiny_pair_answers_what_its_steps_give_in_process(pair):
    answer = wfpredict(pair, "tiny_pair", json=ROW)
    assert answer.status_code == 200, answer.text
    assert answer.json() == pytest.approx(in_process(ROW), rel=1e-5, abs=1e-6)
    assert answer.headers.get("x-request-id")
    # each node is a model of its own, its function nodes in workers (never the controller)
    names = {m["modelName"] for m in pair.manage("GET", "/models").json()["models"]}
    assert names == {"tiny_pair__pre", "tiny_pair__left", "tiny_pair__right",
                     "tiny_pair__aggregate"}
    pre = pair.describe("tiny_pair__pre")[0]
    assert pre["workers"][0]["pid"] not in (pair.proc.pid, None)
    assert (pre["batchSize"], pre["maxWorkers"]) == (1, 1)
    assert pair.describe("tiny_pair__left")[0]["batchSize"] == 4
    assert pre["workflowName"] == "tiny_pair"
    metrics = pair.metrics()
    assert metrics['mservd_workflow_requests_total{status="2XX",workflow_name="tiny_pair"}'] == 1


def test_siblings_run_together_under_concurrent_clients(pair):
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: wfpredict(pair, "tiny_pair", json=[i] * 64),
                                range(24)))
    assert [a.status_code for a in answers] == [200] * 24
    assert answers[5].json() == pytest.approx(in_process([5.0] * 64), rel=1e-5, abs=1e-6)


def test_scaling_one_node_model_scales_only_that_node(pair):
    answer = pair.manage("PUT", "/models/tiny_pair__left",
                         params={"min_worker": 2, "synchronous": "true"})
    assert answer.status_code == 200, answer.text
    assert len(pair.describe("tiny_pair__left")[0]["workers"]) == 2
    assert len(pair.describe("tiny_pair__right")[0]["workers"]) == 1
    assert wfpredict(pair, "tiny_pair", json=ROW).status_code == 200


def test_a_killed_node_worker_is_retried_and_the_run_answers_200(pair):
    (pid,) = pair.worker_pids("tiny_pair__right")
    os.kill(pid, signal.SIGKILL)
    answer = wfpredict(pair, "tiny_pair", json=ROW)
    assert answer.status_code == 200, answer.text
    assert answer.json() == pytest.approx(in_process(ROW), rel=1e-5, abs=1e-6)
    failures = pair.metrics()
    assert failures.get('mservd_workflow_node_failures_total{node="right",'
                        'workflow_name="tiny_pair"}', 0) >= 1


@pytest.fixture
def chain(daemon_factory, wars):
    daemon = daemon_factory(MODEL_API, args=("--disable-token-auth",))
    answer = register(daemon, "echo_chain.war")
    assert answer.status_code == 200, answer.text + daemon.logs()
    return daemon


def test_a_failing_node_answers_500_naming_the_node(chain):
    answer = wfpredict(chain, "echo_chain", json={"raise": "no good"})
    assert answer.status_code == 500
    body = answer.json()
    assert body["code"] == 500 and body["type"] == "InternalServerException"
    assert body["message"].startswith("Workflow 'echo_chain' node 'echo' (model "
                                      "echo_chain__echo version 1.0) failed: ")
    assert "no good" in body["message"]


def test_the_clients_deadline_covers_the_whole_graph(chain):
    answer = wfpredict(chain, "echo_chain", json={"sleep": 1.0},
                       headers={"X-Request-Timeout-Ms": "200"})
    assert answer.status_code == 504, answer.text
    assert answer.json()["type"] == "RequestTimeoutException"
    assert "['echo']" in answer.json()["message"]
    # the daemon goes on serving
    ok = wfpredict(chain, "echo_chain", json={"n": 1})
    assert ok.status_code == 200, ok.text
    assert ok.json()["after_echo"]["echo"] == {"n": 1}


def test_a_4_mb_body_passes_through_every_node(chain):
    text = "x" * (4 * 1024 * 1024)
    answer = wfpredict(chain, "echo_chain", json={"big": text}, timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.json()["after_echo"]["echo"]["big"] == text


def test_management_wording_and_shapes(daemon_factory, wars):
    daemon = daemon_factory(MODEL_API, args=("--disable-token-auth",))
    assert register(daemon, "echo_chain.war").status_code == 200
    assert daemon.manage("GET", "/workflows").json() == {
        "workflows": [{"workflowName": "echo_chain", "workflowUrl": "echo_chain.war"}]}
    assert daemon.manage("GET", "/workflows/echo_chain").json() == [{
        "workflowName": "echo_chain", "workflowUrl": "echo_chain.war", "minWorkers": 1,
        "maxWorkers": 1, "batchSize": 1, "maxBatchDelay": 50,
        "workflowDag": "{echo=[post]}"}]
    again = register(daemon, "echo_chain.war")
    assert (again.status_code, again.json()["message"]) == (
        409, "Workflow echo_chain is already registered.")
    node = daemon.manage("DELETE", "/models/echo_chain__echo")
    assert node.status_code == 403
    assert node.json()["message"] == ("Model echo_chain__echo belongs to workflow echo_chain; "
                                      "unregister the workflow.")
    missing = daemon.manage("GET", "/workflows/nope")
    assert (missing.status_code, missing.json()["message"]) == (404, "Workflow not found: nope")
    assert wfpredict(daemon, "nope", json={}).status_code == 404
    assert register(daemon, "sub/echo_chain.war").status_code == 400
    assert daemon.manage("DELETE", "/workflows/echo_chain").json() == {
        "status": 'Workflow "echo_chain" unregistered'}
    wait_until(lambda: not daemon.manage("GET", "/models").json()["models"], 30,
               "the node models to go")
    assert daemon.manage("GET", "/workflows").json() == {"workflows": []}


def test_a_node_whose_mar_sets_its_workers_keeps_them_and_takes_the_specs_batching(
        daemon_factory, wars, store):
    """TorchServe's rule: the spec's max-workers unless the .mar's model-config.yaml sets
    minWorkers and maxWorkers; batch-size and max-batch-delay always the spec's."""
    daemon = daemon_factory(MODEL_API, args=("--disable-token-auth",))
    write_archive(store, "echotwo", "echo_handler.py",
                  config={"minWorkers": 2, "maxWorkers": 2, "batchSize": 8})
    workflow_archives.write_workflow_archive(
        store, "echo_chain", name="own_workers",
        spec="models: {max-workers: 1, batch-size: 3, echo: {url: echotwo.mar}}\n"
             "dag: {echo: [post]}\n")
    answer = register(daemon, "own_workers.war")
    assert answer.status_code == 200, answer.text + daemon.logs()
    echo = daemon.describe("own_workers__echo")[0]
    assert (echo["minWorkers"], echo["maxWorkers"], echo["batchSize"]) == (2, 2, 3)
    wait_until(lambda: len(daemon.describe("own_workers__echo")[0]["workers"]) == 2, 60,
               "the node's two workers")
    post = daemon.describe("own_workers__post")[0]  # a function node: one worker
    assert (post["minWorkers"], post["maxWorkers"]) == (1, 1)
    assert wfpredict(daemon, "own_workers", json={"x": 1}).status_code == 200


def test_a_bad_spec_is_a_400_and_a_failing_node_rolls_back(daemon_factory, wars, store):
    daemon = daemon_factory(MODEL_API, args=("--disable-token-auth",))
    workflow_archives.write_workflow_archive(
        store, "echo_chain", name="bad_node", spec="dag: {echo: [nowhere]}\n"
                                                  "models: {echo: {url: echo.mar}}\n")
    bad = register(daemon, "bad_node.war")
    assert bad.status_code == 400
    assert "dag node 'nowhere' is neither a model" in bad.json()["message"]
    workflow_archives.write_workflow_archive(
        store, "echo_chain", name="crashing", spec="dag: {echo: [post]}\n"
                                                   "models: {echo: {url: crash.mar}}\n")
    failed = register(daemon, "crashing.war")
    assert failed.status_code == 500, failed.text
    message = failed.json()["message"]
    assert message.startswith("Workflow crashing has failed to register. Failures: [")
    assert "echo: Failed to start workers for model crashing__echo version: 1.0" in message
    wait_until(lambda: not daemon.manage("GET", "/models").json()["models"], 30,
               "the nodes registered to be rolled back")
    assert daemon.manage("GET", "/workflows").json() == {"workflows": []}
    assert daemon.proc.poll() is None


def test_registering_workflows_needs_the_model_api(daemon_factory, wars):
    daemon = daemon_factory(args=("--disable-token-auth",))
    answer = register(daemon, "echo_chain.war")
    assert answer.status_code == 405
    assert answer.json()["type"] == "MethodNotAllowedException"
    assert daemon.manage("DELETE", "/workflows/echo_chain").status_code == 405


def cli(daemon, *args: str):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mservd", "workflows", *args, "--log-dir",
                             str(daemon.log_dir)], check=False, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_workflow_store_load_workflows_snapshot_restart_and_cli(daemon_factory, wars, tmp_path):
    flows = tmp_path / "flows"
    flows.mkdir()
    workflow_archives.write_workflow_archive(flows, "echo_chain", name="chain_b")
    daemon = daemon_factory({**MODEL_API, "load_workflows": "chain_b.war"},
                            args=("--disable-token-auth", "--workflow-store", str(flows)))
    # loaded at start from the workflow store (not the model store, which lacks it)
    assert daemon.manage("GET", "/workflows").json() == {
        "workflows": [{"workflowName": "chain_b", "workflowUrl": "chain_b.war"}]}
    assert wfpredict(daemon, "chain_b", json={"n": 2}).json()["after_echo"]["echo"] == {"n": 2}
    scaled = daemon.manage("PUT", "/models/chain_b__echo",
                           params={"min_worker": 2, "max_worker": 3, "synchronous": "true"})
    assert scaled.status_code == 200, scaled.text
    # the CLI
    assert cli(daemon, "list").split() == ["NAME", "URL", "chain_b", "chain_b.war"]
    assert "dag:     {echo=[post]}" in cli(daemon, "describe", "chain_b")
    # a restart restores the workflow from the snapshot, with its node's scale
    daemon.stop()
    snapshots = sorted((daemon.log_dir / "config").glob("*-snapshot.json"))
    document = json.loads(snapshots[-1].read_text())
    assert document["models"] == {}
    assert document["workflows"][0]["nodes"]["echo"] == {"minWorkers": 2, "maxWorkers": 3}
    daemon.start()
    assert [w["workflowName"] for w in daemon.manage("GET", "/workflows").json()["workflows"]] \
        == ["chain_b"]
    wait_until(lambda: len(daemon.describe("chain_b__echo")[0]["workers"]) == 2, 60,
               "the restored node's 2 workers")
    assert daemon.describe("chain_b__echo")[0]["maxWorkers"] == 3
    assert wfpredict(daemon, "chain_b", json={"n": 3}).status_code == 200
    assert "unregistered" in cli(daemon, "unregister", "chain_b")
    assert cli(daemon, "list").strip() == "No workflows are registered."


def test_a_workflow_named_as_a_leased_model_still_runs_its_graph(daemon_factory, wars):
    daemon = daemon_factory({**MODEL_API, "load_models": "echo.mar"},
                            args=("--disable-token-auth",))
    answer = register(daemon, "echo_chain.war", workflow_name="echo")  # the model's name
    assert answer.status_code == 200, answer.text
    leased = 'mservd_leased_requests_total{model_name="echo",model_version="1.0"}'
    for _ in range(30):  # lone requests: echo's idle worker is lent to the frontend
        assert daemon.predict("echo", json={"n": 0}).status_code == 200
    wait_until(lambda: daemon.metrics().get(leased, 0) > 0, 10, "echo's worker on a lease")
    answer = wfpredict(daemon, "echo", json={"n": 5})
    assert answer.status_code == 200, answer.text
    assert answer.json()["after_echo"]["echo"] == {"n": 5}


def test_bad_registrations_answer_json_errors_and_a_json_body_registers(daemon_factory, wars):
    daemon = daemon_factory(MODEL_API, args=("--disable-token-auth",))
    missing = daemon.manage("POST", "/workflows")
    assert missing.status_code == 400 and "url is required" in missing.json()["message"]
    model = register(daemon, "tiny.mar")
    assert model.status_code == 400
    assert "is not a workflow archive" in model.json()["message"]
    absent = register(daemon, "absent.war")
    assert absent.status_code == 404 and set(absent.json()) == {"code", "type", "message"}
    bad_name = register(daemon, "echo_chain.war", workflow_name="../x")
    assert bad_name.status_code == 400
    timeout = register(daemon, "echo_chain.war", response_timeout="-1")
    assert timeout.status_code == 400 and "response_timeout" in timeout.json()["message"]
    body = daemon.manage("POST", "/workflows", json={"url": "echo_chain.war",
                                                      "workflow_name": "by_body"}, timeout=180)
    assert body.status_code == 200, body.text
    assert wfpredict(daemon, "by_body", json={"n": 1}).status_code == 200
    assert daemon.proc.poll() is None


def test_a_client_that_goes_away_drops_its_runs_queued_node_call(chain):
    import requests

    with ThreadPoolExecutor(1) as pool:
        mark = chain.log_end("model_echo_chain__echo.log")
        busy = pool.submit(wfpredict, chain, "echo_chain", json={"sleep": 2.0})
        chain.wait_for_log("model_echo_chain__echo.log", "echo sleeping", since=mark)
        with pytest.raises(requests.exceptions.ReadTimeout):  # it hangs up, queued behind
            wfpredict(chain, "echo_chain", json={"marker": "gone-client"}, timeout=0.5)
        assert busy.result().status_code == 200
    after = wfpredict(chain, "echo_chain", json={"marker": "after"})
    assert after.status_code == 200
    log = chain.read_log("model_echo_chain__echo.log", mark)
    assert "'after'" in log and "gone-client" not in log
