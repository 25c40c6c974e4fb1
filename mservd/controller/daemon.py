"""Running the daemon in the foreground: bind, start the frontends, load models, loop, stop.

This is what ``mservd start --foreground`` runs (and what ``mservd start`` runs detached). It
owns the process-level pieces around the controller: the log, the pid and state files in the
log folder, the HTTP ports (held for the frontends), the frontend processes
(``frontends/processes.py``), the signals, and its run folder (its sockets and unpacked
archives, under the system temp folder): removed at stop, and, should the daemon be killed
before it can, by the next start of any daemon of this user (:func:`remove_orphan_run_folders`).
"""

from __future__ import annotations

import gc
import json
import logging
import logging.handlers
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mservd import __version__
from mservd.auth import KeyStore
from mservd.config import Settings, parse_address, tls
from mservd.config.model_keys import traffic_of_models_block
from mservd.controller import snapshot
from mservd.controller.frontend_processes import Frontends
from mservd.controller.log_rotation import LogRotation
from mservd.controller.model_folder import is_model_folder
from mservd.controller.supervisor import detect_gpus
from mservd.controller.zygote_client import Zygote
from mservd.process.environment import hide_own_environment
from mservd.process.log_format import formatter

if TYPE_CHECKING:
    from mservd.controller.loop import Controller
    from mservd.protocol import Reply

log = logging.getLogger("mservd")

PID_FILE = "mservd.pid"
STATE_FILE = "mservd.state.json"
KEY_FILE = "key_file.json"
RUN_PREFIX = "mservd-"  # a run folder's name under the system temp folder
RUN_OWNER = "mservd.owner.json"  # in a run folder: the daemon that made it (pid, start time)


class StartError(Exception):
    """The daemon cannot start; the message says why and what to do."""


def pid_path(log_dir: Path) -> Path:
    return log_dir / PID_FILE


def state_path(log_dir: Path) -> Path:
    return log_dir / STATE_FILE


def running_pid(log_dir: Path) -> int | None:
    """The pid of a live daemon that uses ``log_dir``, or None (a stale pid file is ignored)."""
    try:
        pid = int(pid_path(log_dir).read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return pid
    return pid if b"mservd" in cmdline else None


def process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, /proc/<pid>/stat's 22nd field): with the
    pid it names one process, whatever pid is reused later. None if it is gone or unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])  # past the command's parentheses
    except (IndexError, ValueError):
        return None


def make_run_folder() -> Path:
    """This daemon's run folder, stamped with its owner: a later start knows it for ours and
    can tell whether its daemon still runs."""
    run_dir = Path(tempfile.mkdtemp(prefix=RUN_PREFIX))
    owner = {"pid": os.getpid(), "started": process_start(os.getpid()), "mservd": __version__}
    (run_dir / RUN_OWNER).write_text(json.dumps(owner))
    return run_dir


def remove_orphan_run_folders(temp: Path | None = None) -> list[Path]:
    """Remove the run folders of daemons that are gone (killed before their stop removed
    them: sockets and unpacked archives, hundreds of MB). Only folders recognisably ours are
    touched: named ``mservd-*``, owned by this user, stamped with RUN_OWNER, whose daemon (pid
    and start time) no longer runs and whose controller socket takes no connection. Returns
    those removed."""
    removed = []
    for folder in Path(temp or tempfile.gettempdir()).glob(RUN_PREFIX + "*"):
        try:
            if is_orphan_run_folder(folder):
                shutil.rmtree(folder)
                removed.append(folder)
        except OSError as exc:  # another start removing it too, or not ours to remove
            log.warning("could not remove the run folder %s of a daemon that is gone: %s",
                        folder, exc)
    if removed:
        log.info("removed %d run folders of daemons that are gone: %s", len(removed),
                 ", ".join(str(folder) for folder in removed))
    return removed


def is_orphan_run_folder(folder: Path) -> bool:
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return False
    try:
        owner = json.loads((folder / RUN_OWNER).read_text())
        pid, started = int(owner["pid"]), owner.get("started")
    except (OSError, ValueError, KeyError, TypeError):
        return False  # not stamped: not recognisably ours
    if pid == os.getpid() or (process_start(pid) is not None
                              and process_start(pid) == started):
        return False  # its daemon runs
    return not controller_listens(folder / "frontend.sock")


def controller_listens(path: Path) -> bool:
    """Whether a live controller holds the socket at ``path`` (a daemon in another pid
    namespace sharing this temp folder, whose pid means nothing here)."""
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def configure_logging(settings: Settings, log_dir: Path, to_stderr: bool) -> None:
    root = logging.getLogger()
    root.setLevel(settings.log_level)
    fmt = formatter(settings.log_format)
    handler = logging.FileHandler(log_dir / "mservd.log")
    handler.setFormatter(fmt)
    root.addHandler(handler)
    if to_stderr:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(fmt)
        root.addHandler(stream)


def hold_port(address: str, what: str) -> socket.socket:
    """Bind ``address`` and hold its port without listening: gunicorn's arbiter listens on it
    with SO_REUSEPORT, a listener per HTTP worker (``frontends/http/arbiter.py``), and a
    socket that does not listen is dealt no connections. Port 0 becomes a free port here,
    once for all of them."""
    _, host, port = parse_address(address)  # http or https: the frontends know which
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # first without SO_REUSEPORT, which would let us share a port another server listens on
    for reuse_port in (False, True):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise StartError(f"Cannot listen on {what} {address!r}: {exc.strerror}. Is another "
                             "server using it? Set another port in config.properties.") from None
        if not reuse_port:
            port = sock.getsockname()[1]  # port 0: the free port the kernel chose
            sock.close()
    return sock


def startup_workflows(settings: Settings) -> list[tuple[str | None, str]]:
    """``load_workflows`` as (workflow name or None, .war url) pairs; ``all`` is every
    ``.war`` in the workflow store."""
    items: list[tuple[str | None, str]] = []
    store = settings.workflow_store or settings.model_store
    for entry in settings.load_workflows:
        entry = entry.strip()
        if entry == "all" and store:
            items += [(None, p.name) for p in sorted(Path(store).glob("*.war"))
                      if not p.name.startswith(".")]
        elif entry:
            name, sep, url = entry.partition("=")
            items.append((name, url) if sep else (None, entry))
    return items


def startup_models(settings: Settings) -> list[tuple[str | None, str]]:
    """``load_models`` as (model name or None, archive url) pairs; ``all`` is every archive
    and transformers model folder in the store."""
    items: list[tuple[str | None, str]] = []
    for entry in settings.load_models:
        entry = entry.strip()
        if not entry:
            continue
        if entry == "all":
            if settings.model_store:
                store = Path(settings.model_store)
                for path in sorted(store.iterdir()):
                    if path.name.startswith("."):
                        continue
                    if path.suffix == ".mar" or path.name.endswith(".tar.gz") or (
                            path.is_dir() and (path / "MAR-INF" / "MANIFEST.json").exists()) or (
                            is_model_folder(path)):
                        items.append((None, path.name))
            continue
        name, sep, url = entry.partition("=")
        items.append((name, url) if sep else (None, entry))
    # the models= block names archives too (marName)
    for name, versions in settings.models.items():
        for entry in versions.values():
            mar = entry.get("marName") if isinstance(entry, dict) else None
            if mar and (name, mar) not in items and (None, mar) not in items:
                items.append((name, mar))
    return items


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.log_dir = Path(settings.log_dir).resolve()
        self.stop_signal = False
        self.frontends: Frontends | None = None
        self.failure: str | None = None  # why the daemon stopped on its own, if it did
        self.ready = False  # the state file says it serves
        self.ports: dict[str, socket.socket] = {}
        self.warnings: list[str] = []

    def run(self, to_stderr: bool = True) -> int:
        settings = self.settings
        self.log_dir.mkdir(parents=True, exist_ok=True)
        pid = running_pid(self.log_dir)
        if pid is not None and pid != os.getpid():
            raise StartError(f"mservd is already running (pid {pid}) with log folder "
                             f"{str(self.log_dir)!r}. Stop it with 'mservd stop' first.")
        configure_logging(settings, self.log_dir, to_stderr)
        rotation = LogRotation(self.log_dir, settings.log_max_bytes, settings.log_backup_count)
        if settings.model_store and not Path(settings.model_store).is_dir():
            raise StartError(f"Model store {settings.model_store!r} is not a directory.")
        try:  # a certificate that cannot serve fails the start, not each handshake
            if tls.needs(settings):
                tls.server_context(settings.certificate_file, settings.private_key_file)
        except ValueError as exc:
            raise StartError(str(exc)) from None
        served = [("inference_address", settings.inference_address),
                  ("management_address", settings.management_address)]
        if settings.enable_metrics_api:  # false: no metrics port, as in TorchServe
            served.append(("metrics_address", settings.metrics_address))
        for what, address in served:
            port = hold_port(address, what)
            if any(held.getsockname()[1] == port.getsockname()[1]
                   for held in self.ports.values()):
                port.close()
                raise StartError(f"{what} {address!r} has the port of another address; give "
                                 "the inference, management and metrics addresses a port each.")
            self.ports[what.split("_")[0]] = port
        self._addresses = self.addresses()
        # the zygote imports torch (most of the time to ready) while the rest of us starts
        zygote = Zygote(settings.blacklist_env_vars)
        zygote.start()
        hide_own_environment(settings.blacklist_env_vars)
        from mservd.controller.loop import Controller
        from mservd.protocol import Reply

        state_path(self.log_dir).unlink(missing_ok=True)
        pid_path(self.log_dir).write_text(str(os.getpid()))
        remove_orphan_run_folders()
        run_dir = make_run_folder()
        keys = None
        key_file = Path(KEY_FILE).resolve()
        if not settings.disable_token_authorization:
            keys = KeyStore(key_file, settings.token_expiration_min)
        gpus = settings.number_of_gpu if settings.number_of_gpu is not None else detect_gpus()
        controller = Controller(settings, f"ipc://{run_dir}/frontend.sock",
                                f"ipc://{run_dir}/backend.sock", run_dir, keys, gpus, zygote)
        controller.start()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        restarts = controller.metrics.frontend_restarts
        frontends = self.frontends = Frontends(settings, self.log_dir, self.ports,
                                               f"ipc://{run_dir}/frontend.sock", keys is not None,
                                               lambda kind: restarts.labels(kind).inc())
        try:
            frontends.start()
            rotation.start()
            controller.on_stopped = frontends.stop
            registrations, defaults, traffic = self.startup_registrations()
            workflows = self.startup_workflows()
            controller.startup_pending = len(registrations) + len(workflows)
            results: dict[str, Any] = {}

            def finish_startup() -> None:
                for name, version in defaults.items():
                    if controller.registry.has_version(name, version):
                        controller.registry.set_default(name, version)
                for problem in controller.management.restore_traffic(traffic):
                    self.warnings.append(problem)
                controller.registry_changed()
                if self.failure is not None:  # a frontend died while the models loaded
                    return
                why = frontends.wait_ready(timeout=60.0)
                if why is not None:
                    self.stop_on_failure(why)
                    return
                self.write_state(keys, key_file, results, controller)

            def loaded(label: str):
                def respond(reply: Reply) -> None:
                    controller.startup_pending -= 1
                    if reply.status >= 400:
                        body = reply.body if isinstance(reply.body, dict) else {}
                        message = body.get("message") or (reply.body.decode()
                                                          if isinstance(reply.body, bytes)
                                                          else str(reply.body))
                        results[label] = message
                        log.error("start-up model %s failed: %s", label, message)
                    if controller.startup_pending == 0:
                        finish_startup()
                return respond

            for args in registrations:
                label = args.get("model_name") or args["url"]
                try:
                    result = controller.management.op_register(args, loaded(label), startup=True)
                except Exception as exc:  # a bad entry must not stop the others
                    from mservd.errors import MservdError

                    message = exc.message if isinstance(exc, MservdError) else str(exc)
                    loaded(label)(Reply(400, {"message": message}))
                    continue
                if result is not None:
                    loaded(label)(result)
            for flow in workflows:  # (their node models are not in registrations)
                label = flow.args.get("workflow_name") or flow.args["url"]
                try:
                    controller.management.op_register_workflow(
                        flow.args, self.scaled(controller, flow.scales, loaded(label)),
                        startup=True)
                except Exception as exc:  # a bad entry must not stop the others
                    from mservd.errors import MservdError

                    message = exc.message if isinstance(exc, MservdError) else str(exc)
                    loaded(label)(Reply(400, {"message": message}))
            if not registrations and not workflows:
                finish_startup()
            log.info("mservd %s serving (pid %d)", __version__, os.getpid())
            gc.freeze()  # what start-up made lives on: full collections skip it
            controller.run(lambda: self.stop_signal, frontends.alive, self.watch_frontends)
        finally:
            rotation.stop()
            frontends.stop()
            frontends.wait(timeout=settings.drain_timeout + 5)
            controller.close()
            for sock in self.ports.values():
                sock.close()
            shutil.rmtree(run_dir, ignore_errors=True)
            pid_path(self.log_dir).unlink(missing_ok=True)
            state_path(self.log_dir).unlink(missing_ok=True)
            if keys is not None:
                keys.remove()
            log.info("mservd stopped")
        if self.failure is not None:
            if not self.ready:  # `mservd start` shows this, not a daemon nobody can reach
                raise StartError(f"mservd cannot serve: {self.failure}")
            return 1
        return 0

    def startup_workflows(self) -> list[snapshot.WorkflowRestore]:
        """Workflows to register at start: the newest good snapshot's, else
        ``load_workflows``."""
        if self.settings.snapshot:
            restore = snapshot.load_latest(self.log_dir)
            if restore.path is not None:
                return restore.workflows
        return [snapshot.WorkflowRestore(
            {"url": url, **({"workflow_name": name} if name else {})}, {})
            for name, url in startup_workflows(self.settings)]

    @staticmethod
    def scaled(controller: Controller, scales: dict[str, tuple[int, int]],
               respond: Callable[[Reply], None]) -> Callable[[Reply], None]:
        """``respond``, once a restored workflow's node models are scaled as they were."""
        def registered(reply: Reply) -> None:
            if reply.status < 400:
                for model, (low, high) in scales.items():
                    if model in controller.registry:
                        controller.management.op_scale(
                            {"model": model, "min_worker": low, "max_worker": high},
                            lambda reply: None)
            respond(reply)
        return registered

    def startup_registrations(self) -> tuple[list[dict[str, Any]], dict[str, str],
                                             dict[str, Any]]:
        """Register calls for the start: the newest good snapshot, else ``load_models``;
        with each model's default version and traffic policy (the ``models=`` block's when
        no snapshot says)."""
        if self.settings.snapshot:
            restore = snapshot.load_latest(self.log_dir)
            self.warnings.extend(restore.problems)
            if restore.path is not None:
                log.info("restoring %d model versions from snapshot %s",
                         len(restore.registrations), restore.path.name)
                return (restore.registrations, restore.defaults,
                        {**traffic_of_models_block(self.settings.models), **restore.traffic})
        registrations = []
        for name, url in startup_models(self.settings):
            args = {"url": url, "synchronous": "true"}
            if name:
                args["model_name"] = name
            registrations.append(args)
        return registrations, {}, traffic_of_models_block(self.settings.models)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop_signal = True  # the loop sees it within one turn

    def watch_frontends(self, now: float) -> None:
        """From the controller's loop: start again a frontend that died; stop when none can
        serve (a daemon that answers nothing must not pass for a running one)."""
        why = self.frontends.watch(now) if self.frontends is not None else None
        if why is not None and self.failure is None:
            self.stop_on_failure(why)

    def stop_on_failure(self, why: str) -> None:
        log.error("stopping: %s", why)
        self.failure = why
        self.stop_signal = True

    def addresses(self) -> dict[str, str]:
        out = {}
        secure = tls.tls_apis(self.settings)
        for api, sock in self.ports.items():
            host, port = sock.getsockname()[:2]
            out[api] = f"{'https' if api in secure else 'http'}://{host}:{port}"
        return out

    def write_state(self, keys: KeyStore | None, key_file: Path, failures: dict[str, Any],
                    controller: Any) -> None:
        state = {
            "pid": os.getpid(),
            "version": __version__,
            "addresses": self._addresses,
            "grpc": self.frontends.grpc_addresses() if self.frontends is not None else None,
            "key_file": str(key_file) if keys is not None else None,
            # the client commands trust it: a self-signed certificate works on loopback
            "certificate_file": (str(Path(self.settings.certificate_file).resolve())
                                 if tls.needs(self.settings) else None),
            "models": controller.registry.names(),
            "failed": failures,
            "warnings": self.warnings,
        }
        tmp = state_path(self.log_dir).with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_path(self.log_dir))
        self.ready = True
        log.info("ready: %s", state["addresses"])
