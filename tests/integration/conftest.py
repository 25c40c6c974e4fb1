"""Running the real daemon on 127.0.0.1 for integration tests.

Every listener binds port 0; the daemon runs in its own session with its logs under the test's
tmp folder, and its ports come from the state file it writes when ready. Teardown sends TERM,
then KILL to the group, and checks that no process of the daemon survives.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

REPO = Path(__file__).resolve().parents[2]


def spawn_worker(run_dir: Path, handler_file: str, batch_size: int = 4,
                 **spec: Any) -> subprocess.Popen:
    """A real worker process (``python -m mservd.worker``) for the fixture handler
    ``handler_file``, its controller socket ``<run_dir>/backend.sock`` (the test binds it)."""
    import shutil

    from mservd.specs import WorkerSpec

    model_dir = run_dir / "model"
    model_dir.mkdir()
    shutil.copy(REPO / "tests" / "fixtures" / "handlers" / handler_file, model_dir)
    name = Path(handler_file).stem
    manifest = {"model": {"modelName": name, "modelVersion": "1.0", "handler": handler_file}}
    worker = WorkerSpec(worker_id="9000", endpoint=f"ipc://{run_dir}/backend.sock",
                        model_name=name, version="1.0", model_dir=str(model_dir),
                        manifest=manifest, handler=handler_file, batch_size=batch_size,
                        gpu_id=None, threads=1, model_yaml={}, max_response_size=1 << 20,
                        **spec)
    return subprocess.Popen([sys.executable, "-m", "mservd.worker", worker.to_json()], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
FIXTURE_HANDLERS = REPO / "tests" / "fixtures" / "handlers"
START_TIMEOUT = 180.0


def _build_all():
    spec = importlib.util.spec_from_file_location("build_all", REPO / "samples" / "build_all.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_archive(store: Path, name: str, handler: str, version: str = "1.0",
                  config: dict[str, Any] | None = None, **kwargs: Any) -> Path:
    import yaml

    from archiver import write_archive as write

    config_file = None
    if config is not None:
        config_file = store / f".{name}-{version}-model-config.yaml"
        config_file.write_text(yaml.safe_dump(config))
    export = store / f".build-{name}-{version}"
    export.mkdir(exist_ok=True)
    path = write(model_name=name, version=version, handler=str(FIXTURE_HANDLERS / handler),
                 config_file=config_file, export_path=export, force=True, **kwargs)
    target = store / (f"{name}.mar" if version == "1.0" else f"{name}-{version}.mar")
    path.replace(target)
    return target


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model store holding the real sample archives and the test fixtures' archives."""
    folder = tmp_path_factory.getbasetemp() / "sample-archives"
    _build_all().build_samples(export_path=folder)
    write_archive(folder, "echo", "echo_handler.py")
    write_archive(folder, "echo", "echo_handler.py", version="2.0")
    write_archive(folder, "echobatch", "echo_handler.py",
                  config={"batchSize": 8, "maxBatchDelay": 2000, "minWorkers": 1,
                          "maxWorkers": 1})
    write_archive(folder, "crash", "crash_on_init.py")
    write_archive(folder, "diesoon", "dies_soon.py")
    write_archive(folder, "slowinit", "slow_init.py")
    return folder


class Daemon:
    """One ``mservd start --foreground`` on loopback, with helpers to call its APIs."""

    def __init__(self, workdir: Path, store: Path, properties: dict[str, Any] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.store = store
        self.log_dir = workdir / "logs"
        props = {
            "inference_address": "http://127.0.0.1:0",
            "management_address": "http://127.0.0.1:0",
            "metrics_address": "http://127.0.0.1:0",
            "grpc_inference_port": 0,
            "grpc_management_port": 0,
            "model_store": str(store),
            "default_workers_per_model": 1,
            "frontend_workers": 1,
            "drain_timeout": 20,
            **(properties or {}),
        }
        self.config = workdir / "config.properties"
        self.config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.state: dict[str, Any] = {}
        self.session = requests.Session()

    def start(self) -> Daemon:
        state_file = self.log_dir / "mservd.state.json"
        state_file.unlink(missing_ok=True)  # left behind by a daemon that was killed
        with open(self.workdir / "daemon.out", "ab") as out:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mservd", "start", "--foreground", "--ts-config",
                 str(self.config), "--log-dir", str(self.log_dir), *self.args],
                cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={k: v for k, v in os.environ.items() if k != "PORT"})

        def ready() -> bool:
            if not state_file.exists() and self.proc.poll() is not None:
                pytest.fail(f"mservd exited with {self.proc.returncode}:\n{self.logs()}")
            return state_file.exists()

        wait_until(ready, START_TIMEOUT, "mservd to write its state file", details=self.logs)
        self.state = json.loads(state_file.read_text())
        return self

    def logs(self) -> str:
        parts = []
        for name in ("daemon.out", "logs/mservd.log", "logs/frontend.log"):
            path = self.workdir / name
            if path.exists():
                parts.append(f"--- {name}\n" + path.read_text(errors="replace")[-4000:])
        for path in sorted(self.log_dir.glob("model_*.log")):
            parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)

    def log_end(self, name: str) -> int:
        """The size of ``logs/<name>`` now: a mark to read what is written after it."""
        try:
            return (self.log_dir / name).stat().st_size
        except FileNotFoundError:
            return 0

    def read_log(self, name: str, since: int = 0) -> str:
        """The text of ``logs/<name>`` from the byte offset ``since`` ('' while it is absent)."""
        try:
            with open(self.log_dir / name, "rb") as handle:
                handle.seek(since)
                return handle.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, name: str, text: str, since: int = 0, timeout: float = 30) -> None:
        """Wait until ``text`` is in ``logs/<name>`` after the mark ``since``."""
        wait_until(lambda: text in self.read_log(name, since), timeout,
                   f"{text!r} in logs/{name}", details=self.logs)

    def metrics(self) -> dict[str, float]:
        """The metrics port's samples, by name with labels: ``{'m{l="v"}': 1.0}``."""
        text = requests.get(self.url("metrics", "/metrics"), timeout=10).text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    # -- addresses and keys -----------------------------------------------------------

    def url(self, api: str, path: str) -> str:
        return self.state["addresses"][api] + path

    def grpc_address(self, api: str) -> str:
        """``127.0.0.1:PORT`` of the gRPC ``inference`` or ``management`` service."""
        return self.state["grpc"][api]

    def key(self, kind: str) -> str | None:
        if not self.state.get("key_file"):
            return None
        return json.loads(Path(self.state["key_file"]).read_text())[kind]["key"]

    def _headers(self, kind: str, headers: dict[str, str] | None) -> dict[str, str]:
        out = dict(headers or {})
        key = self.key(kind)
        if key and "Authorization" not in out:
            out["Authorization"] = f"Bearer {key}"
        return out

    def predict(self, model: str, version: str | None = None, headers=None, timeout=60,
                **kwargs: Any) -> requests.Response:
        path = f"/predictions/{model}" + (f"/{version}" if version else "")
        return self.session.post(self.url("inference", path),
                                 headers=self._headers("inference", headers), timeout=timeout,
                                 **kwargs)

    def manage(self, method: str, path: str, timeout=120, headers=None,
               **kwargs: Any) -> requests.Response:
        return self.session.request(method, self.url("management", path),
                                    headers=self._headers("management", headers),
                                    timeout=timeout, **kwargs)

    def openai_client(self):
        """OpenAI's own client, pointed at this daemon's ``/v1`` with its inference key."""
        import openai

        return openai.OpenAI(base_url=self.url("inference", "/v1"),
                             api_key=self.key("inference") or "unused", max_retries=0)

    def describe(self, model: str, version: str | None = None) -> list[dict[str, Any]]:
        answer = self.manage("GET", f"/models/{model}" + (f"/{version}" if version else ""))
        assert answer.status_code == 200, answer.text
        return answer.json()

    def worker_pids(self, model: str, version: str | None = None) -> set[int]:
        return {w["pid"] for w in self.describe(model, version)[0]["workers"]}

    # -- stopping ----------------------------------------------------------------------

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 60.0) -> int:
        """TERM, wait, then KILL the group; the daemon's exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        children = self.descendants()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
        _gone, alive = psutil.wait_procs(children, timeout=10)
        for proc in alive:
            proc.kill()
        assert not alive, f"processes outlived the daemon: {[p.pid for p in alive]}"
        return code


@pytest.fixture
def daemon_factory(tmp_path: Path, store: Path):
    started: list[Daemon] = []

    def make(properties: dict[str, Any] | None = None, args: tuple[str, ...] = (),
             name: str = "d") -> Daemon:
        workdir = tmp_path / name
        workdir.mkdir()
        daemon = Daemon(workdir, store, properties, args)
        started.append(daemon)
        return daemon.start()

    yield make
    for daemon in started:
        daemon.stop()


def _process(daemon: Daemon, marker: str) -> psutil.Process | None:
    """The daemon's process whose command line holds ``marker`` (gone ones passed over)."""
    for child in daemon.descendants():
        try:
            if marker in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def http_arbiter(daemon: Daemon) -> psutil.Process | None:
    """gunicorn's arbiter of the daemon's HTTP frontends (named by setproctitle)."""
    return _process(daemon, "gunicorn: master")


def grpc_frontend(daemon: Daemon) -> psutil.Process | None:
    return _process(daemon, "mservd.frontends.grpc.server")


def http_workers(daemon: Daemon) -> list[psutil.Process]:
    """The live HTTP frontend workers: the arbiter's children."""
    arbiter = http_arbiter(daemon)
    if arbiter is None:
        return []
    try:
        return [p for p in arbiter.children() if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


def too_late_behind_a_busy_worker(daemon: Daemon, send_late: Callable[[], Any] | None = None
                                  ) -> tuple[Any, int]:
    """Send echo a request with a 300 ms deadline while its one worker sleeps 3 s on another
    (time for the late one to reach the queue on a slow minute): that answer, and the model
    log's length before both (the late one must never show in it). ``send_late`` sends the
    late one some other way (its answer is returned); by default, over HTTP."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        mark = daemon.log_end("model_echo.log")
        busy = pool.submit(daemon.predict, "echo", json={"sleep": 3.0})
        daemon.wait_for_log("model_echo.log", "echo sleeping", since=mark)
        late = send_late() if send_late is not None else daemon.predict(
            "echo", json={"marker": "too-late"}, headers={"X-Request-Timeout-Ms": "300"})
        assert busy.result().status_code == 200
    return late, mark


def controller_busy_during(daemon: Daemon, loops: list[Callable[[float], Any]],
                           seconds: float) -> tuple[float, float]:
    """Runs each of ``loops`` on its own thread until ``seconds`` from now (each is given that
    monotonic deadline): the daemon's CPU seconds (its controller's) and the seconds it took."""
    import threading

    controller = psutil.Process(daemon.proc.pid)
    before = sum(controller.cpu_times()[:2])
    started = time.monotonic()
    threads = [threading.Thread(target=loop, args=(started + seconds,)) for loop in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(controller.cpu_times()[:2]) - before, time.monotonic() - started


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1,
               details: Callable[[], str] | None = None) -> Any:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy, and
    return that; fail the test after ``timeout`` seconds, saying what it waited for (and
    ``details()``, such as the daemon's logs).

    Tests wait on a condition like this, never on a fixed sleep: a sleep is too short on a
    loaded machine and too long everywhere else."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    extra = f"\n{details()}" if details is not None else ""
    pytest.fail(f"timed out after {timeout} s waiting for {what}{extra}")
