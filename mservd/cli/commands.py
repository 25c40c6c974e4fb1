"""The ``mservd`` command: start, stop and inspect the daemon, and debug a handler.

Commands receive resolved ``Settings``; only ``main`` exits. ``start`` runs the daemon detached
(the same program with ``--foreground``, in a new session) and returns once it answers and its
start-up models are loaded, printing the addresses.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from mservd import __version__
from mservd.cli.run_handler import run_handler_command
from mservd.config import ConfigError, Settings, load, parse_address
from mservd.config.tls import client_context
from mservd.controller.model_folder import is_model_folder

DETACHED_ENV = "MSERVD_DETACHED"
# Knative (so KServe) tells a serving container its port in PORT (usually 8080).
PORT_ENV = "PORT"


def resolve_settings(ts_config: str | None, **flags: Any) -> Settings:
    config_file = ts_config or os.environ.get("TS_CONFIG_FILE")
    overrides = {k: v for k, v in flags.items() if v is not None}
    try:
        return load(config_file, env=os.environ, overrides=overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def port_env_address(settings: Settings, environ: Any = None) -> str | None:
    """The inference address with its port replaced by ``$PORT``, or None to leave it.

    Precedence: ``PORT`` beats the inference address's port from config.properties or
    ``TS_INFERENCE_ADDRESS``; the host is kept (``0.0.0.0`` in a container). When ``PORT`` is
    the gRPC inference port, it is left to gRPC: that is how Knative routes a ``grpc-v2``
    InferenceService, whose one declared port (h2c) is the gRPC one.
    """
    raw = (os.environ if environ is None else environ).get(PORT_ENV, "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise click.ClickException(f"{PORT_ENV}={raw!r} is not a port (0-65535).")
    if port == settings.grpc_inference_port:
        return None
    scheme, host, _ = parse_address(settings.inference_address)
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def _split_models(values: tuple[str, ...], model_store: str | None) -> tuple[str, ...] | None:
    """The --models items; a model folder named relative to the current folder (and not in the
    model store) is made absolute, since the daemon resolves names against the store."""
    items = []
    for item in (item for value in values for item in value.replace(",", " ").split() if item):
        name, sep, url = item.partition("=")
        if not sep:
            name, url = "", item
        path = Path(url)
        in_store = model_store is not None and (Path(model_store) / url).exists()
        if not path.is_absolute() and not in_store and is_model_folder(path):
            item = f"{name}{sep}{path.resolve()}"
        items.append(item)
    return tuple(items) if items else None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mservd")
def cli() -> None:
    """mservd: serve PyTorch models packaged as .mar archives over REST and gRPC.

    config.properties keys and their defaults are listed in mservd/config.py and in the
    repository's config.properties.
    """


@cli.command("start")
@click.option("--model-store", type=click.Path(file_okay=False), help="Folder of .mar archives.")
@click.option("--workflow-store", type=click.Path(file_okay=False),
              help="Folder of workflow archives (.war); default: the model store.")
@click.option("--models", "models", multiple=True,
              help="Models to load at start: NAME=FILE.mar, FILE.mar, NAME=FOLDER (a "
                   "transformers model folder, served as it is) or all (repeatable, or "
                   "comma-separated).")
@click.option("--ts-config", type=click.Path(dir_okay=False, exists=True),
              help="A config.properties file (also TS_CONFIG_FILE).")
@click.option("--log-dir", type=click.Path(file_okay=False),
              help="Folder for logs, the pid and state files (default: logs).")
@click.option("--foreground", is_flag=True, help="Stay attached (for containers); log to stderr.")
@click.option("--ncs", "--no-config-snapshots", "ncs", is_flag=True,
              help="Do not restore or write registry snapshots.")
@click.option("--enable-model-api", is_flag=True,
              help="Allow registering and unregistering models over the management API.")
@click.option("--disable-token-auth", is_flag=True, help="Serve without token authorization.")
@click.option("--grpc-port", "--grpc-inference-port", "grpc_port", type=click.IntRange(0, 65535),
              help="gRPC inference port (grpc_inference_port; 0 picks a free port).")
@click.option("--grpc-management-port", type=click.IntRange(0, 65535),
              help="gRPC management port (grpc_management_port; 0 picks a free port).")
def start_command(model_store, workflow_store, models, ts_config, log_dir, foreground, ncs, enable_model_api,
                  disable_token_auth, grpc_port, grpc_management_port) -> None:
    """Start the daemon; return once it serves and its start-up models are loaded.

    The PORT environment variable (set by Knative/KServe) replaces the inference address's
    port, unless it is the gRPC inference port.
    """
    from mservd.controller.daemon import Daemon, StartError, running_pid, state_path

    flags = {
        "model_store": model_store, "workflow_store": workflow_store, "load_models": _split_models(models, model_store), "log_dir": log_dir,
        "snapshot": False if ncs else None,
        "enable_model_api": True if enable_model_api else None,
        "disable_token_authorization": True if disable_token_auth else None,
        "grpc_inference_port": grpc_port, "grpc_management_port": grpc_management_port}
    settings = resolve_settings(ts_config, **flags)
    inference_address = port_env_address(settings)
    if inference_address is not None:
        settings = resolve_settings(ts_config, **flags, inference_address=inference_address)
    log_dir_path = Path(settings.log_dir).resolve()
    if foreground:
        try:
            code = Daemon(settings).run(to_stderr=not os.environ.get(DETACHED_ENV))
        except StartError as exc:
            raise click.ClickException(str(exc)) from None
        sys.exit(code)  # 1: it stopped on its own, no frontend could serve (see mservd.log)
    pid = running_pid(log_dir_path)
    if pid is not None:
        raise click.ClickException(f"mservd is already running (pid {pid}) with log folder "
                                   f"{str(log_dir_path)!r}. Stop it with 'mservd stop' first.")
    log_dir_path.mkdir(parents=True, exist_ok=True)
    state_path(log_dir_path).unlink(missing_ok=True)
    argv = [a for a in sys.argv[1:]]
    child_args = [sys.executable, "-m", "mservd", *argv, "--foreground"]
    with open(log_dir_path / "mservd.out", "ab") as out:
        proc = subprocess.Popen(child_args, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, env={**os.environ, DETACHED_ENV: "1"})
    deadline = time.monotonic() + settings.default_startup_timeout + 60
    state_file = state_path(log_dir_path)
    while time.monotonic() < deadline:
        if state_file.exists():
            break
        if proc.poll() is not None:
            tail = (log_dir_path / "mservd.out").read_text(errors="replace").strip().splitlines()
            detail = "\n".join(tail[-15:])
            raise click.ClickException(f"mservd failed to start (exit code {proc.returncode}):"
                                       f"\n{detail}")
        time.sleep(0.1)
    else:
        raise click.ClickException(f"mservd (pid {proc.pid}) did not become ready in time; see "
                                   f"{log_dir_path / 'mservd.log'}.")
    state = json.loads(state_file.read_text())
    _print_state(state)
    for warning in state.get("warnings", []):
        click.echo(f"warning: {warning}", err=True)
    for model, why in state.get("failed", {}).items():
        click.echo(f"model {model} failed to load: {why}", err=True)


def _print_state(state: dict[str, Any]) -> None:
    click.echo(f"mservd {state.get('version', '')} running (pid {state['pid']})")
    for api in ("inference", "management", "metrics"):
        address = state["addresses"].get(api, "off (enable_metrics_api=false)")
        click.echo(f"  {api + ' API:':<16} {address}")
    click.echo(f"  {'dashboard:':<16} {state['addresses']['management']}/dashboard")
    if state.get("key_file"):
        click.echo(f"  {'keys:':<16} {state['key_file']}")
    else:
        click.echo(f"  {'keys:':<16} token authorization disabled")


@cli.command("stop")
@click.option("--log-dir", type=click.Path(file_okay=False), default="logs", show_default=True,
              help="The log folder of the daemon to stop.")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for the drain before killing.")
def stop_command(log_dir: str, timeout: float) -> None:
    """Stop the daemon: finish accepted requests, stop workers, exit."""
    from mservd.controller.daemon import running_pid

    pid = running_pid(Path(log_dir).resolve())
    if pid is None:
        raise click.ClickException(f"mservd is not running (no live pid in {log_dir}).")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            click.echo(f"mservd stopped (pid {pid})")
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    raise click.ClickException(f"mservd (pid {pid}) did not stop within {timeout:.0f} s; killed.")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@cli.command("status")
@click.option("--log-dir", type=click.Path(file_okay=False), default="logs", show_default=True)
def status_command(log_dir: str) -> None:
    """Print the running daemon, its models and their workers."""
    from mservd.controller.daemon import running_pid, state_path

    log_dir_path = Path(log_dir).resolve()
    pid = running_pid(log_dir_path)
    if pid is None:
        raise click.ClickException(f"mservd is not running (no live pid in {log_dir}).")
    try:
        state = json.loads(state_path(log_dir_path).read_text())
    except OSError:
        click.echo(f"mservd (pid {pid}) is starting")
        return
    _print_state(state)
    headers = {}
    if state.get("key_file"):
        keys = json.loads(Path(state["key_file"]).read_text())
        headers["Authorization"] = f"Bearer {keys['management']['key']}"
    base = state["addresses"]["management"]
    context = client_context(state.get("certificate_file")) if base.startswith("https:") else None
    try:
        listing = _get_json(f"{base}/models?limit=1000", headers, context)
        for entry in listing.get("models", []):
            for mv in _get_json(f"{base}/models/{entry['modelName']}/all", headers, context):
                default = " (default)" if mv.get("isDefault") else ""
                click.echo(f"  model {mv['modelName']} {mv['modelVersion']}{default}: "
                           f"{len(mv['workers'])} workers, batch {mv['batchSize']}, "
                           f"queue {mv['jobQueueStatus']['pendingRequests']}")
                for w in mv["workers"]:
                    click.echo(f"    worker {w['id']} pid {w['pid']} {w['status']} "
                               f"{w['memoryUsage'] / 2**20:.0f} MiB")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise click.ClickException(f"the management API did not answer: {exc}") from None


def _get_json(url: str, headers: dict[str, str], context: ssl.SSLContext | None) -> Any:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        return json.loads(answer.read())


cli.add_command(run_handler_command)


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="mservd", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


from mservd.cli.client import metrics_command, models_group
from mservd.cli.workflows import workflows_group

cli.add_command(models_group)
cli.add_command(workflows_group)
cli.add_command(metrics_command)
