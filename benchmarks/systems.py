"""Start and stop each benchmarked system on 127.0.0.1, and look at its processes.

- :class:`Mservd`: ``python -m mservd start --foreground`` with a private config (ports 0) and
  log folder; its ports come from ``<log-dir>/mservd.state.json``, written once it serves with
  its start-up models loaded.
- :class:`NaiveFlask`: ``benchmarks/naive_flask.py``, one gunicorn sync worker, no batching.
- :class:`TorchServe`: ``torchserve --start --foreground`` (0.12.0, when installed) on free
  ports, with a private TMPDIR (its pid file lives there) and log folder; stopped with
  ``torchserve --stop``.

Every system is stopped by the PIDs of its own process tree (never by name), and
:meth:`System.stop` checks that none of them survives.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
SERVER_NICE = 10  # servers run below the load generator, every system alike
START_TIMEOUT = 150.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ValueError):
        return 0, b""


def smaps_rollup(pid: int) -> tuple[int, int]:
    """(Rss, Pss) of one process in bytes, from /proc/<pid>/smaps_rollup; (0, 0) if gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


def _below_the_client() -> None:
    """Run a server (and what it starts) at SERVER_NICE: on a machine it shares with the load
    generator, a saturated server would otherwise take the client's CPU, and the client would
    measure its own wait for a core as the server's latency (open loop most of all)."""
    os.nice(SERVER_NICE)


class System:
    name = "system"
    workdir: Path

    def __init__(self, store: Path, workers: int, batch_size: int, max_batch_delay: int,
                 job_queue_size: int = 100) -> None:
        self.store = store
        self.workers = workers
        self.batch_size = batch_size
        self.max_batch_delay = max_batch_delay
        self.job_queue_size = job_queue_size
        self.proc: subprocess.Popen | None = None
        self.inference_url = ""
        self.ready_seconds: float | None = None
        self._known: dict[int, psutil.Process] = {}
        self.workdir = Path(tempfile.mkdtemp(prefix=f"bench-{self.name}-"))

    # -- to implement ------------------------------------------------------------------
    def command(self, models: list[str]) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def wait_ready(self, models: list[str], deadline: float) -> None:
        raise NotImplementedError

    def role(self, proc: psutil.Process) -> str:
        return proc.name()

    # -- shared ------------------------------------------------------------------------
    def start(self, models: list[str]) -> float:
        """Start serving ``models`` (names in the store); seconds from the command to ready."""
        cmd, env = self.command(models)
        out = open(self.workdir / "server.out", "ab")  # noqa: SIM115 -- the child keeps it
        started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, cwd=self.workdir, env=env, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True,
                                     # it calls os.nice alone: no lock a thread could hold
                                     preexec_fn=_below_the_client)  # noqa: PLW1509
        try:
            self.wait_ready(models, time.monotonic() + START_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.perf_counter() - started
        self.processes()
        return self.ready_seconds

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted(self.workdir.rglob("*")):
            if path.is_file() and path.suffix in (".out", ".log"):
                parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(parts)[-12000:]

    def processes(self) -> list[psutil.Process]:
        """The live processes of the system: the command's process and all its descendants."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for p in procs:
            self._known.setdefault(p.pid, p)
        return procs

    def pids(self) -> set[int]:
        """Every process of the system seen so far (before it is stopped)."""
        return {*self._known, *(p.pid for p in self.processes())}

    def memory(self) -> dict[str, Any]:
        """RSS and PSS summed over the process tree, in MiB, with one entry per process."""
        per = []
        for p in self.processes():
            rss, pss = smaps_rollup(p.pid)
            try:
                role = self.role(p)
            except psutil.Error:
                continue
            per.append({"pid": p.pid, "role": role, "rss_mib": rss / 2**20, "pss_mib": pss / 2**20})
        return {"processes": len(per),
                "rss_mib": round(sum(x["rss_mib"] for x in per), 1),
                "pss_mib": round(sum(x["pss_mib"] for x in per), 1),
                "per_process": per}

    def cpu_times(self) -> dict[int, tuple[str, float]]:
        """{pid: (role, user+system CPU seconds)} of the live processes."""
        out = {}
        for p in self.processes():
            try:
                t = p.cpu_times()
                out[p.pid] = (self.role(p), t.user + t.system)
            except psutil.Error:
                pass
        return out

    def stop(self) -> None:
        if self.proc is None:
            return
        procs = list({**self._known, **{p.pid: p for p in self.processes()}}.values())
        self._stop_command()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        _gone, alive = psutil.wait_procs(procs, timeout=15)
        for p in alive:  # by PID only: these are this system's own processes
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        self.proc = None
        self._known = {}
        if alive:
            print(f"  ! {self.name}: killed {len(alive)} processes that outlived the stop",
                  file=sys.stderr)

    def _stop_command(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)


class Mservd(System):
    name = "mservd"
    properties: Mapping[str, Any] = {}  # more config.properties keys (a models= block, say)

    def command(self, models: list[str]) -> tuple[list[str], dict[str, str]]:
        props = {
            "inference_address": "http://127.0.0.1:0",
            "management_address": "http://127.0.0.1:0",
            "metrics_address": "http://127.0.0.1:0",
            "grpc_inference_port": 0,
            "grpc_management_port": 0,
            "model_store": str(self.store),
            "load_models": ",".join(f"{m}.mar" for m in models),
            "default_workers_per_model": self.workers,
            "batch_size": self.batch_size,
            "max_batch_delay": self.max_batch_delay,
            "job_queue_size": self.job_queue_size,
            "enable_snapshot": "false",
            **self.properties,
        }
        config = self.workdir / "config.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.log_dir = self.workdir / "logs"
        if self.log_dir.exists():
            shutil.rmtree(self.log_dir)
        return ([sys.executable, "-m", "mservd", "start", "--foreground", "--ts-config",
                 str(config), "--log-dir", str(self.log_dir), "--disable-token-auth", "--ncs"],
                dict(os.environ))

    def wait_ready(self, models: list[str], deadline: float) -> None:
        state_file = self.log_dir / "mservd.state.json"
        while time.monotonic() < deadline:
            if state_file.exists():
                try:
                    state = json.loads(state_file.read_text())
                except ValueError:
                    state = None  # being written
                if state:
                    self.inference_url = state["addresses"]["inference"]
                    self.management_url = state["addresses"]["management"]
                    return
            self._check_alive()
            time.sleep(0.02)
        raise TimeoutError(f"mservd not ready in {START_TIMEOUT} s:\n{self.logs()}")

    def role(self, proc: psutil.Process) -> str:
        cmd = " ".join(proc.cmdline())
        if self.proc is not None and proc.pid == self.proc.pid:
            return "controller"
        if "gunicorn: master [mservd-http]" in cmd or "mservd.frontends.http.arbiter" in cmd:
            return "http arbiter"
        if "gunicorn: worker [mservd-http]" in cmd:
            return "http frontend"
        if "mservd.frontends.grpc" in cmd:
            return "grpc frontend"
        if proc.name().startswith("mservd:"):  # a worker forked by the zygote, named by model
            return f"worker {proc.name().removeprefix('mservd:')}"
        if "mservd.worker.zygote" in cmd:
            return "zygote"
        return proc.name()


class NaiveFlask(System):
    name = "naive-flask"

    def command(self, models: list[str]) -> tuple[list[str], dict[str, str]]:
        self.port = free_port()
        return ([sys.executable, "-m", "benchmarks.naive_flask", "--store", str(self.store),
                 "--models", ",".join(models), "--port", str(self.port)],
                {**os.environ, "PYTHONPATH": str(REPO)})

    def wait_ready(self, models: list[str], deadline: float) -> None:
        self.inference_url = f"http://127.0.0.1:{self.port}"
        while time.monotonic() < deadline:
            status, _ = http_get(self.inference_url + "/ping", 2.0)
            if status == 200:
                return
            self._check_alive()
            time.sleep(0.05)
        raise TimeoutError(f"naive-flask not ready:\n{self.logs()}")

    def role(self, proc: psutil.Process) -> str:
        if self.proc is not None and proc.pid == self.proc.pid:
            return "gunicorn master"
        return "flask worker"


TS_VENV = REPO / ".venv-torchserve"  # TorchServe's own environment (make bench makes it)


def torchserve_available() -> str | None:
    """None when TorchServe 0.12 can run in its own environment, as its users run it, with
    Java; else why not."""
    python = TS_VENV / "bin" / "python"
    if not (TS_VENV / "bin" / "torchserve").exists():
        return (f"TorchServe's own environment {TS_VENV} is missing: make bench makes it "
                "(python -m venv, then torch, torchvision, torchserve==0.12.0, captum, pyyaml)")
    probe = subprocess.run([str(python), "-c", "import ts.model_server"], capture_output=True,
                           timeout=120, check=False)
    if probe.returncode != 0:
        return f"torchserve does not import in {TS_VENV}: {probe.stderr[-300:]!r}"
    leak = subprocess.run([str(python), "-c", "import mservd"], capture_output=True,
                          timeout=60, check=False, env=_ts_env_base(), cwd="/")  # as it runs:
    # from its own folder, never this checkout
    if leak.returncode == 0:
        return f"mservd is importable in {TS_VENV}: TorchServe must run without it"
    if shutil.which("java") is None:
        return "no java on PATH (TorchServe's frontend is a JVM)"
    return None


def torchserve_version() -> str | None:
    python = TS_VENV / "bin" / "python"
    if not python.exists():
        return None
    script = "import importlib.metadata as m; print(m.version('torchserve'))"
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                         timeout=60, check=False)
    return out.stdout.strip() or None


def _ts_env_base() -> dict[str, str]:
    """This environment without anything that would put mservd on TorchServe's path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{TS_VENV / 'bin'}:{env.get('PATH', '')}"
    return env


class TorchServe(System):
    name = "torchserve"

    def _exe(self) -> list[str]:
        # its own `torchserve` script, in its own environment (where mservd is not installed:
        # mservd's drop-in `torchserve` must never be what this column measures)
        return [str(TS_VENV / "bin" / "torchserve")]

    def _env(self) -> dict[str, str]:
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        return {**_ts_env_base(), "TMPDIR": str(tmp), "LOG_LOCATION": str(self.workdir / "logs"),
                "METRICS_LOCATION": str(self.workdir / "logs"),
                "TS_DISABLE_SYSTEM_METRICS": "true"}

    def command(self, models: list[str]) -> tuple[list[str], dict[str, str]]:
        self.ports = {k: free_port() for k in ("inference", "management", "metrics", "grpc_i",
                                                 "grpc_m")}
        block = {m: {"1.0": {"defaultVersion": True, "marName": f"{m}.mar",
                             "minWorkers": self.workers, "maxWorkers": self.workers,
                             "batchSize": self.batch_size, "maxBatchDelay": self.max_batch_delay,
                             "responseTimeout": 120}} for m in models}
        props = {
            "inference_address": f"http://127.0.0.1:{self.ports['inference']}",
            "management_address": f"http://127.0.0.1:{self.ports['management']}",
            "metrics_address": f"http://127.0.0.1:{self.ports['metrics']}",
            "grpc_inference_port": self.ports["grpc_i"],
            "grpc_management_port": self.ports["grpc_m"],
            "model_store": str(self.store),
            "load_models": ",".join(f"{m}.mar" for m in models),
            "default_workers_per_model": self.workers,
            "job_queue_size": self.job_queue_size,
            "disable_token_authorization": "true",
            "enable_model_api": "false",
            "disable_system_metrics": "true",
            "install_py_dep_per_model": "false",
            "models": json.dumps(block),
        }
        config = self.workdir / "config.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.inference_url = props["inference_address"]
        self.management_url = props["management_address"]
        return ([*self._exe(), "--start", "--foreground", "--model-store", str(self.store),
                 "--ts-config", str(config), "--disable-token-auth", "--ncs",
                 "--models", *[f"{m}={m}.mar" for m in models]], self._env())

    def wait_ready(self, models: list[str], deadline: float) -> None:
        pending = set(models)
        while time.monotonic() < deadline:
            for m in list(pending):
                status, body = http_get(f"{self.management_url}/models/{m}", 2.0)
                if status == 200:
                    try:
                        workers = json.loads(body)[0]["workers"]
                    except (ValueError, KeyError, IndexError):
                        workers = []
                    if len(workers) >= self.workers and all(
                            w.get("status") == "READY" for w in workers):
                        pending.discard(m)
            if not pending:
                return
            self._check_alive()
            time.sleep(0.05)
        raise TimeoutError(f"torchserve not ready:\n{self.logs()}")

    def role(self, proc: psutil.Process) -> str:
        cmd = " ".join(proc.cmdline())
        if "java" in proc.name() or "org.pytorch.serve" in cmd:
            return "java frontend"
        if "model_service_worker" in cmd:
            return "worker"
        if self.proc is not None and proc.pid == self.proc.pid:
            return "launcher"
        return proc.name()

    def _stop_command(self) -> None:
        subprocess.run([*self._exe(), "--stop"], env=self._env(), cwd=self.workdir,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
        assert self.proc is not None
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
