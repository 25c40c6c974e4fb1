"""TorchServe drop-in: archives from the real ``torch-model-archiver`` around handlers written the
way TorchServe users write them (``ts.*`` imports) serve through mservd, and a TorchServe
``config.properties`` with a ``models=`` block starts mservd through the ``torchserve`` entry.

Two daemons for the module: one started like the other integration tests, loading every archive
(each in a different archive format), and one started with ``torchserve --start`` from a
TorchServe config with ``install_py_dep_per_model=true``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import psutil
import pytest
import requests
from conftest import REPO, Daemon, wait_until

ARCHIVER = REPO / ".venv" / "bin" / "torch-model-archiver"
if not ARCHIVER.exists():
    ARCHIVER = Path(sys.executable).with_name("torch-model-archiver")

pytestmark = pytest.mark.skipif(not ARCHIVER.exists(),
                                reason="TorchServe's torch-model-archiver is not installed")

# --- handlers, as a TorchServe user writes them -------------------------------------------------

CLASS_HANDLER = '''
import json

import torch
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler


class Doubler(BaseHandler):
    """A TorchScript model (x @ 2I) behind BaseHandler, recording its own metrics."""

    def preprocess(self, data):
        rows = []
        for row in data:
            body = row.get("data") or row.get("body")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body)
            rows.append(body["x"])
        return torch.tensor(rows, dtype=torch.float32)

    def postprocess(self, data):
        self.context.metrics.add_counter("DropinCalls", len(data))
        self.context.metrics.add_metric("DropinBatch", len(data), "count", None, None,
                                        MetricTypes.GAUGE)
        return data.tolist()

    def describe_handle(self):  # GET /models/cls?customized=true
        return {"model": "doubler", "weights": "2I", "batch": self.context.system_properties[
            "batch_size"]}
'''

FUNCTION_HANDLER = '''
from ts.utils.util import PredictionException


def handle(data, context):
    if data is None:
        return None
    out = []
    for idx, row in enumerate(data):
        body = row.get("data") or row.get("body")
        if isinstance(body, (bytes, bytearray)):
            body = body.decode()
        if "teapot" in str(body):
            raise PredictionException("I am a teapot, not a model", 418)
        echo = {"echo": body, "model": context.model_name}
        url_path = context.get_request_header(idx, "url_path")
        if url_path is not None:
            echo["url_path"] = url_path
        tenant = context.get_request_header(idx, "x_tenant")
        if tenant is not None:
            echo["x_tenant"] = tenant
        out.append(echo)
    return out
'''

STREAM_HANDLER = '''
import time

from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    for i in range(3):
        send_intermediate_predict_response(
            [f"part{i} " for _ in data], context.request_ids, "Intermediate Prediction success",
            200, context)
        time.sleep(0.8)
    print("stream handler done", flush=True)  # tests read this in the model's log
    return ["final" for _ in data]
'''

DEPS_HANDLER = '''
def handle(data, context):
    if data is None:
        return None
    try:
        import tinydep
        value = tinydep.VALUE
    except ImportError:
        value = None
    return [{"tinydep": value} for _ in data]
'''

TINY_CNN = '''
import torch.nn as nn


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 6)

    def forward(self, x):
        return self.fc(self.pool(self.conv(x)).flatten(1))
'''

ONNX_HANDLER = '''
import json
import time

import numpy as np
from ts.torch_handler.base_handler import BaseHandler


class OnnxTripler(BaseHandler):
    """An ONNX model (x @ 3I) behind BaseHandler, whose model is an onnxruntime session.

    Each batch takes 0.3 s, so that requests sent together queue behind the first and share
    a batch however fast the machine answers one."""

    def preprocess(self, data):
        bodies = [row.get("data") or row.get("body") for row in data]
        return np.array([(json.loads(b) if isinstance(b, (bytes, bytearray)) else b)["x"]
                         for b in bodies], dtype=np.float32)

    def inference(self, data):
        time.sleep(0.3)
        return self.model.run(None, {self.model.get_inputs()[0].name: data})[0]

    def postprocess(self, data):
        return data.tolist()
'''

LABELS = {str(i): name for i, name in enumerate(["cat", "dog", "fox", "owl", "elk", "yak"])}


def archive(work: Path, store: Path, name: str, handler: Path | str, fmt: str = "default",
            **flags: str) -> None:
    """Run the real torch-model-archiver (it stages in $TMPDIR/<model-name>)."""
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    cmd = [str(ARCHIVER), "--model-name", name, "--version", "1.0", "--handler", str(handler),
           "--export-path", str(store), "--archive-format", fmt, "--force"]
    for flag, value in flags.items():
        cmd += [f"--{flag.replace('_', '-')}", str(value)]
    done = subprocess.run(cmd, env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel ``tinydep 0.1``, so installing needs no index."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tinydep-0.1-py3-none-any.whl"
    info = "tinydep-0.1.dist-info"
    files = {
        "tinydep.py": 'VALUE = "installed-per-model"\n',
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: tinydep\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
    return path


@pytest.fixture(scope="module")
def ts_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    work = tmp_path_factory.mktemp("ts-src")
    store = tmp_path_factory.mktemp("ts-store")

    # a class handler over a TorchScript model, default format
    (work / "doubler.py").write_text(CLASS_HANDLER)
    linear = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        linear.weight.copy_(2 * torch.eye(2))
    torch.jit.save(torch.jit.script(linear), str(work / "doubler.pt"))
    archive(work, store, "cls", work / "doubler.py", serialized_file=work / "doubler.pt")

    # a module-function handler, zip-store
    (work / "handler.py").write_text(FUNCTION_HANDLER)
    archive(work, store, "func", work / "handler.py", "zip-store")

    # a streaming handler, tgz
    (work / "stream").mkdir()
    (work / "stream" / "stream_handler.py").write_text(STREAM_HANDLER)
    archive(work, store, "stream", work / "stream" / "stream_handler.py", "tgz")

    # the built-in image_classifier with an eager model file and state dict, no-archive
    (work / "model.py").write_text(TINY_CNN)
    scope: dict = {}
    exec(TINY_CNN, scope)  # noqa: S102 - the model file written above
    torch.manual_seed(0)
    torch.save(scope["TinyNet"]().state_dict(), work / "tiny.pth")
    (work / "index_to_name.json").write_text(json.dumps(LABELS))
    archive(work, store, "imgcls", "image_classifier", "no-archive", model_file=work / "model.py",
            serialized_file=work / "tiny.pth", extra_files=work / "index_to_name.json")

    # a requirements file naming a local wheel: installed only with install_py_dep_per_model
    wheels = tiny_wheel(work / "wheels").parent
    (work / "requirements.txt").write_text(f"--no-index\n--find-links {wheels}\ntinydep==0.1\n")
    (work / "deps").mkdir()
    (work / "deps" / "deps_handler.py").write_text(DEPS_HANDLER)
    archive(work, store, "deps", work / "deps" / "deps_handler.py",
            requirements_file=work / "requirements.txt")

    # an ONNX model (its serialized file .onnx) behind a handler that runs the session itself
    (work / "onnx_handler.py").write_text(ONNX_HANDLER)
    tripler = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        tripler.weight.copy_(3 * torch.eye(2))
    torch.onnx.export(tripler, (torch.zeros(1, 2),), str(work / "tripler.onnx"), dynamo=False,
                      input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    (work / "onnx-config.yaml").write_text("batchSize: 8\nmaxBatchDelay: 500\n")
    archive(work, store, "onnx", work / "onnx_handler.py", serialized_file=work / "tripler.onnx",
            config_file=work / "onnx-config.yaml")

    # the class handler again, over a model AOTInductor compiled into a shared library
    quadrupler = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        quadrupler.weight.copy_(4 * torch.eye(2))
    batch = torch.export.Dim("batch", min=1, max=16)
    torch._export.aot_compile(quadrupler, (torch.zeros(2, 2),),
                              dynamic_shapes={"input": {0: batch}},
                              options={"aot_inductor.output_path": str(work / "quad.so")})
    (work / "aot-config.yaml").write_text("batchSize: 4\nmaxBatchDelay: 500\n"
                                          "pt2: {export: {aot_compile: true}}\n")
    archive(work, store, "aot", work / "doubler.py", serialized_file=work / "quad.so",
            config_file=work / "aot-config.yaml")

    names = sorted(p.name for p in store.iterdir())
    assert names == ["aot.mar", "cls.mar", "deps.mar", "func.mar", "imgcls", "onnx.mar",
                     "stream.tar.gz"], names
    return store


@pytest.fixture(scope="module")
def ts_daemon(tmp_path_factory: pytest.TempPathFactory, ts_store: Path):
    workdir = tmp_path_factory.mktemp("ts-daemon")
    daemon = Daemon(workdir, ts_store, {"load_models": "all", "default_workers_per_model": 1})
    daemon.start()
    yield daemon
    daemon.stop()


def test_every_archive_format_registers(ts_daemon: Daemon) -> None:
    listing = ts_daemon.manage("GET", "/models").json()
    assert sorted(m["modelName"] for m in listing["models"]) == [
        "aot", "cls", "deps", "func", "imgcls", "onnx", "stream"], ts_daemon.logs()
    for name in ("aot", "cls", "deps", "func", "imgcls", "onnx", "stream"):
        [mv] = ts_daemon.describe(name)
        assert len(mv["workers"]) == 1 and mv["workers"][0]["status"] == "READY", mv


def test_class_handler_extending_ts_base_handler(ts_daemon: Daemon) -> None:
    answer = ts_daemon.predict("cls", json={"x": [1.5, -2.0]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == [3.0, -4.0]


def test_an_onnx_model_is_an_onnxruntime_session_as_in_torchserve(ts_daemon: Daemon) -> None:
    """A .onnx serialized file makes BaseHandler's model an onnxruntime session, which the
    handler runs itself (self.model.run), as TorchServe's handlers do; requests batched
    together (model-config.yaml's batchSize 8) each get their own row back."""
    from concurrent.futures import ThreadPoolExecutor

    rows = [[float(i), -1.5 * i] for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda row: ts_daemon.predict("onnx", json={"x": row}), rows))
    for row, answer in zip(rows, answers):
        assert answer.status_code == 200, answer.text
        assert answer.json() == [3 * v for v in row]
    batches = ts_daemon.metrics()['mservd_batch_size_count{model_name="onnx",model_version="1.0"}']
    assert batches < len(rows)  # some requests shared a batch


def test_an_aot_compiled_shared_library_serves_as_in_torchserve(ts_daemon: Daemon) -> None:
    """A .so serialized file that model-config.yaml marks as AOTInductor's
    (pt2: {export: {aot_compile: true}}) is loaded with torch._export.aot_load, as TorchServe
    loads it, behind the same class handler as a TorchScript model; a batch of requests, each
    answered with its own row."""
    from concurrent.futures import ThreadPoolExecutor

    rows = [[float(i), 0.5 - i] for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda row: ts_daemon.predict("aot", json={"x": row}), rows))
    for row, answer in zip(rows, answers):
        assert answer.status_code == 200, answer.text
        assert answer.json() == [4 * v for v in row]


def test_describe_customized_shows_what_the_handlers_describe_handle_returns(
        ts_daemon: Daemon) -> None:
    import grpc

    from mservd.frontends.grpc.generated import management_pb2, management_pb2_grpc

    metadata = {"model": "doubler", "weights": "2I", "batch": 1}
    [plain] = ts_daemon.describe("cls")
    assert "customizedMetadata" not in plain
    counted = 'ts_inference_requests_total{model_name="cls",model_version="1.0"}'
    served = ts_daemon.metrics()[counted]
    for path in ("/models/cls?customized=true", "/models/cls/1.0?customized=true"):
        answer = ts_daemon.manage("GET", path)
        assert answer.status_code == 200, answer.text
        [described] = answer.json()
        assert described["customizedMetadata"] == metadata
        assert described["modelName"] == "cls" and described["workers"][0]["status"] == "READY"
    [every] = ts_daemon.manage("GET", "/models/cls/all?customized=true").json()
    assert "customizedMetadata" not in every  # as TorchServe: all versions, no handler asked

    channel = grpc.insecure_channel(ts_daemon.grpc_address("management"))
    stub = management_pb2_grpc.ManagementAPIsServiceStub(channel)
    key = (("authorization", f"Bearer {ts_daemon.key('management')}"),)
    reply = stub.DescribeModel(management_pb2.DescribeModelRequest(
        model_name="cls", customized=True), metadata=key, timeout=60)
    assert json.loads(reply.msg)[0]["customizedMetadata"] == metadata
    channel.close()

    # the questions were no predictions, and the worker predicts as before
    assert ts_daemon.metrics()[counted] == served
    assert ts_daemon.predict("cls", json={"x": [1.0, 2.0]}).json() == [2.0, 4.0]
    bad = ts_daemon.manage("GET", "/models/cls?customized=maybe")
    assert bad.status_code == 400 and "maybe" in bad.json()["message"]


def test_module_function_handler(ts_daemon: Daemon) -> None:
    answer = ts_daemon.predict("func", json={"say": "hi"})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"echo": {"say": "hi"}, "model": "func"}
    answer = ts_daemon.predict("func", data=b"plain bytes")
    assert answer.json() == {"echo": "plain bytes", "model": "func"}


def test_a_path_past_the_version_reaches_the_handler_as_url_path_and_get_predicts(
        ts_daemon: Daemon) -> None:
    """TorchServe's test_url_path: /predictions/{m}/{v}/<path> gives the handler url_path."""
    for path in ("v1/chat/completion", "v1/completion"):
        answer = ts_daemon.session.post(
            ts_daemon.url("inference", f"/predictions/func/1.0/{path}"), json={"prompt": "hi"},
            headers=ts_daemon._headers("inference", None), timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"echo": {"prompt": "hi"}, "model": "func", "url_path": path}
    got = ts_daemon.session.get(ts_daemon.url("inference", "/predictions/func"),
                                headers=ts_daemon._headers("inference", None), timeout=60)
    assert got.status_code == 200 and got.json()["model"] == "func", got.text


def test_a_header_whose_name_has_underscores_reaches_the_handler(ts_daemon: Daemon) -> None:
    """TorchServe hands its handlers every header; gunicorn drops underscored names unless
    told not to (ts_request_sequence_id is one)."""
    answer = ts_daemon.predict("func", json={"prompt": "hi"}, headers={"x_tenant": "acme"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["x_tenant"] == "acme"


def test_prediction_exception_code_reaches_the_client_typed_as_torchserve_types_it(
        ts_daemon: Daemon) -> None:
    answer = ts_daemon.predict("func", json={"please": "teapot"})
    assert answer.status_code == 418, answer.text
    assert answer.json() == {"code": 418, "type": "InternalServerException",
                             "message": "I am a teapot, not a model"}
    # the worker lives on
    assert ts_daemon.predict("func", json={"say": "again"}).status_code == 200


def test_builtin_image_classifier_with_eager_model_file(ts_daemon: Daemon) -> None:
    from PIL import Image

    image = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 90)).save(image, format="PNG")
    answer = ts_daemon.predict("imgcls", data=image.getvalue())
    assert answer.status_code == 200, answer.text
    top = answer.json()
    assert isinstance(top, dict) and len(top) == 5, top
    assert set(top) <= set(LABELS.values())
    probs = list(top.values())
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-6


def test_streaming_handler_answers_in_chunks(ts_daemon: Daemon) -> None:
    mark = ts_daemon.log_end("model_stream.log")
    answer = ts_daemon.predict("stream", data=b"go", stream=True)
    assert answer.status_code == 200
    assert answer.headers.get("Transfer-Encoding") == "chunked", answer.headers
    assert "Content-Length" not in answer.headers
    assert answer.headers["x-request-id"]
    parts = []
    done_at_first = None
    for chunk in answer.iter_content(None):
        if not parts:
            done_at_first = "stream handler done" in ts_daemon.read_log("model_stream.log", mark)
        parts.append(chunk)
    assert b"".join(parts) == b"part0 part1 part2 final"
    # the first part arrived before the handler finished (it has 2.4 s of work left then)
    assert done_at_first is False
    ts_daemon.wait_for_log("model_stream.log", "stream handler done", since=mark)
    assert len(parts) >= 2
    # a plain client reads the whole streamed answer too
    whole = ts_daemon.predict("stream", data=b"go")
    assert whole.text == "part0 part1 part2 final"


def test_streaming_requests_are_independent(ts_daemon: Daemon) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def one(_):
        return requests.post(ts_daemon.url("inference", "/predictions/stream"), data=b"x",
                             headers={"Authorization": f"Bearer {ts_daemon.key('inference')}"},
                             timeout=60).text

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(one, range(3))) == ["part0 part1 part2 final"] * 3


def test_custom_handler_metrics_reach_prometheus(ts_daemon: Daemon) -> None:
    for i in range(3):
        assert ts_daemon.predict("cls", json={"x": [i, i]}).status_code == 200

    def calls(text: str) -> list[str]:
        return [line for line in text.splitlines()
                if line.startswith("DropinCalls") and 'ModelName="cls"' in line]

    def scraped() -> str:  # a handler's metrics reach the port a moment after its answers
        text = requests.get(ts_daemon.url("metrics", "/metrics"), timeout=10).text
        counted = any(float(line.rsplit(" ", 1)[1]) >= 3 for line in calls(text))
        return text if counted and "DropinBatch" in text else ""

    text = wait_until(scraped, 10, "the handler's Dropin metrics counting 3 calls",
                      details=ts_daemon.logs)
    assert any(line.startswith("DropinBatch") for line in text.splitlines())


def test_requirements_not_installed_without_install_py_dep_per_model(ts_daemon: Daemon) -> None:
    answer = ts_daemon.predict("deps", data=b"?")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"tinydep": None}


# --- torchserve --start with a TorchServe config.properties -------------------------------------

def _torchserve(cwd: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mservd.cli.torchserve", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


def test_torchserve_entry_starts_models_block_config(tmp_path_factory, ts_store: Path) -> None:
    cwd = tmp_path_factory.mktemp("ts-entry")
    models = {
        "func": {"1.0": {"defaultVersion": True, "marName": "func.mar", "minWorkers": 1,
                         "maxWorkers": 2, "batchSize": 4, "maxBatchDelay": 50,
                         "responseTimeout": 60}},
        "deps": {"1.0": {"defaultVersion": True, "marName": "deps.mar", "minWorkers": 1,
                         "maxWorkers": 1, "batchSize": 1, "maxBatchDelay": 100}},
    }
    block = json.dumps(models, indent=2).replace("\n", "\\\n")
    (cwd / "config.properties").write_text(textwrap.dedent("""\
        inference_address=http://127.0.0.1:0
        management_address=http://127.0.0.1:0
        metrics_address=http://127.0.0.1:0
        grpc_inference_port=0
        grpc_management_port=0
        number_of_netty_threads=4
        job_queue_size=10
        frontend_workers=1
        install_py_dep_per_model=true
        """) + f"models={block}\n")

    stopped = _torchserve(cwd, "--stop")
    assert stopped.returncode == 0 and "not currently running" in stopped.stdout

    started = _torchserve(cwd, "--start", "--ts-config", "config.properties", "--model-store",
                          str(ts_store), "--disable-token-auth", "--ncs",
                          "--log-config", "log4j2.xml")
    state_file = cwd / "logs" / "mservd.state.json"
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "ignores --log-config" in started.stderr
        state = json.loads(state_file.read_text())
        inference, management = state["addresses"]["inference"], state["addresses"]["management"]

        [func] = requests.get(f"{management}/models/func", timeout=30).json()
        assert (func["minWorkers"], func["maxWorkers"], func["batchSize"],
                func["maxBatchDelay"]) == (1, 2, 4, 50), func
        assert func["workers"] and func["workers"][0]["status"] == "READY"
        [deps] = requests.get(f"{management}/models/deps", timeout=30).json()
        assert (deps["batchSize"], deps["maxBatchDelay"]) == (1, 100)

        answer = requests.post(f"{inference}/predictions/func", json={"a": 1}, timeout=30)
        assert answer.json() == {"echo": {"a": 1}, "model": "func"}
        answer = requests.post(f"{inference}/predictions/deps", data=b"?", timeout=30)
        assert answer.json() == {"tinydep": "installed-per-model"}, answer.text
    finally:
        pid = json.loads(state_file.read_text())["pid"] if state_file.exists() else None
        stopped = _torchserve(cwd, "--stop", timeout=120)
        if pid is not None and psutil.pid_exists(pid):
            try:
                psutil.Process(pid).kill()  # our own daemon, if --stop failed
            except psutil.NoSuchProcess:
                pass
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "stopped" in stopped.stdout + stopped.stderr
    assert pid is not None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_grpc_stream_predictions_relays_every_part_as_it_comes(ts_daemon: Daemon) -> None:
    import grpc

    from mservd.frontends.grpc.generated import inference_pb2, inference_pb2_grpc

    channel = grpc.insecure_channel(ts_daemon.grpc_address("inference"))
    stub = inference_pb2_grpc.InferenceAPIsServiceStub(channel)
    key = (("authorization", f"Bearer {ts_daemon.key('inference')}"),)
    mark = ts_daemon.log_end("model_stream.log")
    arrivals = []
    for response in stub.StreamPredictions(inference_pb2.PredictionsRequest(
            model_name="stream", input={"data": b"go"}), metadata=key, timeout=60):
        done = "stream handler done" in ts_daemon.read_log("model_stream.log", mark)
        arrivals.append((response.prediction, done))
    assert [part for part, _ in arrivals] == [b"part0 ", b"part1 ", b"part2 ", b"final"]
    assert arrivals[0][1] is False  # the first part came before the handler ended
    ts_daemon.wait_for_log("model_stream.log", "stream handler done", since=mark)
    channel.close()


def test_decode_input_request_false_hands_the_handler_the_bytes_sent(daemon_factory) -> None:
    raw = daemon_factory({"load_models": "echo.mar", "decode_input_request": "false"})
    sent = {"a": [1, 2]}
    # the echo handler answers bytes as their text, anything else as it got it
    assert raw.predict("echo", json=sent).json()["echo"] == json.dumps(sent)
    texts = raw.predict("echo", data="héllo".encode("latin-1"),
                        headers={"Content-Type": "text/plain; charset=latin-1"})
    assert texts.json()["echo"] == "h\ufffdllo"  # the bytes, not latin-1 decoded
