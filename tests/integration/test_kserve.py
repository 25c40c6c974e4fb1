"""mservd started the way KServe starts it, on the layout KServe's storage initializer writes.

A temporary ``mnt/models`` holds ``config/config.properties`` (deploy/kserve/config's example,
bound to 127.0.0.1 with free or chosen ports) and ``model-store/tiny.mar``. The command is the
Dockerfile's ENTRYPOINT followed by the ClusterServingRuntime's args (read from the files, only
the mount path and the gRPC port substituted), with the image's and the runtime's environment
and PORT set as Knative sets it. Then: the readiness probe fails before start-up and passes
after, v2 ready and infer answer on PORT, v2 over gRPC, the metrics port, and SIGTERM drains
and exits 0 with no process left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import yaml

REPO = Path(__file__).resolve().parents[2]
KSERVE = REPO / "deploy" / "kserve"
MOUNT = "/mnt/models"
START_TIMEOUT = 180.0


def free_port() -> int:
    """A port free on 127.0.0.1 now (closed again: a tiny race with other processes)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def runtime_container() -> dict:
    for doc in yaml.safe_load_all((KSERVE / "clusterservingruntime.yaml").read_text()):
        if doc and doc["kind"] == "ClusterServingRuntime":
            (container,) = doc["spec"]["containers"]
            return container
    raise AssertionError("no ClusterServingRuntime")


def protocol_versions() -> list[str]:
    for doc in yaml.safe_load_all((KSERVE / "clusterservingruntime.yaml").read_text()):
        if doc and doc["kind"] == "ClusterServingRuntime":
            return doc["spec"]["protocolVersions"]
    raise AssertionError("no ClusterServingRuntime")


def docker_entry_and_env() -> tuple[list[str], dict[str, str]]:
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    entry: list[str] = []
    env: dict[str, str] = {}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "ENTRYPOINT":
            entry = json.loads(rest)
        elif word == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", rest)))
    return entry, env


def kserve_layout(root: Path, store: Path, metrics_port: int) -> Path:
    """``root/mnt/models`` as KServe's storage initializer lays it out for TorchServe."""
    models = root / "mnt" / "models"
    (models / "config").mkdir(parents=True)
    (models / "model-store").mkdir()
    (models / "model-store" / "tiny.mar").write_bytes((store / "tiny.mar").read_bytes())
    text = (KSERVE / "config" / "config.properties").read_text()
    text = text.replace(MOUNT, str(models))
    # tests bind loopback only; every port but PORT's and the metrics port is picked by the OS
    text = re.sub(r"(?m)^inference_address=.*$", "inference_address=http://127.0.0.1:0", text)
    text = re.sub(r"(?m)^management_address=.*$", "management_address=http://127.0.0.1:0", text)
    text = re.sub(r"(?m)^metrics_address=.*$",
                  f"metrics_address=http://127.0.0.1:{metrics_port}", text)
    text = re.sub(r"(?m)^grpc_management_port=.*$", "grpc_management_port=0", text)
    text = re.sub(r"(?m)^drain_timeout=.*$", "drain_timeout=10", text)
    assert "0.0.0.0" not in "\n".join(line for line in text.splitlines()
                                     if not line.lstrip().startswith("#"))
    (models / "config" / "config.properties").write_text(text)
    return models


def container_args(models: Path) -> list[str]:
    args = []
    for arg in runtime_container()["args"]:
        arg = arg.replace(MOUNT, str(models))
        if arg.startswith("--grpc-port="):
            arg = "--grpc-port=0"  # a fixed 7070 could be taken on a shared machine
        args.append(arg)
    return args


def run_probe(workdir: Path) -> int:
    command = runtime_container()["readinessProbe"]["exec"]["command"]
    assert command[0] == "python"
    done = subprocess.run([sys.executable, *command[1:]], cwd=workdir, capture_output=True,
                          timeout=30, check=False)
    return done.returncode


@pytest.fixture
def kserve_daemon(tmp_path: Path, store: Path):
    port, metrics_port = free_port(), free_port()
    models = kserve_layout(tmp_path, store, metrics_port)
    workdir = tmp_path / "home"  # the image's WORKDIR: logs/ is created under it
    workdir.mkdir()
    entry, image_env = docker_entry_and_env()
    assert entry[0] == "mservd"
    command = [sys.executable, "-m", "mservd", *entry[1:], *container_args(models)]
    env = {**os.environ, **image_env, "PORT": str(port)}
    env.update({e["name"]: e["value"] for e in runtime_container().get("env", [])})
    with open(tmp_path / "daemon.out", "ab") as out:
        proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)

    def logs() -> str:
        parts = [(tmp_path / "daemon.out").read_text(errors="replace")[-4000:]]
        for path in sorted((workdir / "logs").glob("*.log")):
            parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-2000:])
        return "\n".join(parts)

    info = {"proc": proc, "port": port, "metrics_port": metrics_port, "workdir": workdir,
            "logs": logs}
    try:
        yield info
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for_state(info: dict) -> dict:
    from conftest import wait_until

    state_file = info["workdir"] / "logs" / "mservd.state.json"

    def ready() -> bool:
        if not state_file.exists() and info["proc"].poll() is not None:
            pytest.fail(f"mservd exited with {info['proc'].returncode}:\n{info['logs']()}")
        return state_file.exists()

    wait_until(ready, START_TIMEOUT, "mservd to write its state file", details=info["logs"])
    return json.loads(state_file.read_text())


def test_kserve_layout_entry_args_and_port(kserve_daemon: dict) -> None:
    info = kserve_daemon
    # not ready before the start-up models are in: Knative must not route yet
    assert run_probe(info["workdir"]) != 0

    state = wait_for_state(info)
    base = f"http://127.0.0.1:{info['port']}"
    assert state["addresses"]["inference"] == base, "PORT did not set the HTTP port"
    assert state["addresses"]["metrics"] == f"http://127.0.0.1:{info['metrics_port']}"
    assert state["key_file"] is None  # --disable-token-auth, as in the runtime's args
    assert state["models"] == ["tiny"] and not state["failed"]
    assert run_probe(info["workdir"]) == 0

    session = requests.Session()
    ready = session.get(f"{base}/v2/health/ready", timeout=10)
    assert ready.status_code == 200, ready.text
    assert session.get(f"{base}/v2/models/tiny/ready", timeout=10).status_code == 200

    # the workers and batch size of config.properties' models= block were applied
    (described,) = session.get(f"{state['addresses']['management']}/models/tiny",
                               timeout=10).json()
    assert len(described["workers"]) == 2 and described["batchSize"] == 8

    data = np.random.default_rng(0).standard_normal(64).astype(np.float32).tolist()
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 64], "datatype": "FP32", "data": data}]}
    answer = session.post(f"{base}/v2/models/tiny/infer", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    assert output["datatype"] == "FP32" and output["shape"] == [1, 10]
    assert len(output["data"]) == 10

    # TorchServe's route and KServe's v1 route, which the runtime lists, on the same port
    assert "v1" in protocol_versions()
    assert session.post(f"{base}/predictions/tiny", json=data, timeout=60).status_code == 200
    v1 = session.post(f"{base}/v1/models/tiny:predict", json={"instances": [data]}, timeout=60)
    assert v1.status_code == 200, v1.text
    assert len(v1.json()["predictions"][0]) == 10

    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(state["grpc"]["inference"])
    try:
        assert client.is_server_ready()
        tensor = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.asarray([data], dtype=np.float32))
        result = client.infer("tiny", [tensor])
        np.testing.assert_allclose(result.as_numpy(output["name"]),
                                   np.asarray([output["data"]], dtype=np.float32), rtol=1e-5)
    finally:
        client.close()

    metrics = session.get(f"http://127.0.0.1:{info['metrics_port']}/metrics", timeout=10)
    assert metrics.status_code == 200
    assert re.search(r'ts_inference_requests_total\{[^}]*model_name="tiny"', metrics.text)

    # SIGTERM, as Kubernetes stops the container: drain, exit 0, nothing left behind
    proc = info["proc"]
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, info["logs"]()
    _gone, alive = psutil.wait_procs(children, timeout=15)
    for survivor in alive:
        survivor.kill()
    assert not alive, f"processes outlived mservd: {[p.pid for p in alive]}"
