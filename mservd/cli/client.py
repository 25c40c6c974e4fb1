"""Client commands: ``mservd models ...`` and ``mservd metrics`` over the daemon's HTTP APIs.

This module owns talking to a running daemon as a client does: finding it (the state file
``<log-dir>/mservd.state.json`` names its addresses and key file), reading the management key
on its own, calling the management and metrics APIs with ``urllib`` and printing readable
tables, or the API's JSON as it is with ``--json``. It must not import the daemon's internals:
everything it knows comes over HTTP, as it would for any other client.

A synchronous ``register`` or ``scale`` is done as an asynchronous call followed by polling
``describe``, so that progress can be shown on stderr while the workers load.
"""

from __future__ import annotations

import functools
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from mservd.config.tls import client_context

STATE_FILE = "mservd.state.json"
HTTP_TIMEOUT = 30.0
POLL_INTERVAL = 0.25
PROGRESS_EVERY = 5.0  # seconds between repeated progress lines when nothing changes
_REGISTERED = re.compile(r'^Model "(?P<name>.+)" Version: (?P<version>\S+) registered with '
                         r"(?P<workers>\d+) initial workers$")


class ClientError(click.ClickException):
    """A client command failed; shown as ``mservd: error: <message>``, exit code 1."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"mservd: error: {self.format_message()}", err=True, file=file)


class ApiError(ClientError):
    """The API answered with an error: ``<code> <type>: <message>``."""

    def __init__(self, code: int, type_: str, message: str) -> None:
        super().__init__(f"{code} {type_}: {message}")
        self.code = code
        self.type = type_
        self.api_message = message


# -- finding the daemon ------------------------------------------------------------------


@dataclass(frozen=True)
class Client:
    """One daemon's management and metrics addresses and the management key, if any."""

    management_url: str | None
    metrics_url: str | None
    token: str | None
    certificate_file: str | None = None  # the daemon's, trusted over https (mservd/config/tls.py)

    def call(self, method: str, path: str, params: dict[str, Any] | None = None,
             body: Any = None) -> Any:
        """The management API's JSON answer; ``ApiError`` for an error status. ``body``,
        if any, is sent as JSON."""
        if not self.management_url:
            raise ClientError("No management address: pass --management-url or --log-dir of a "
                              "running daemon.")
        status, body, _ = self._request(method, self.management_url, path, params, self.token,
                                        self.certificate_file,
                                        None if body is None else json.dumps(body).encode())
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            doc = None
        if status >= 400:
            if isinstance(doc, dict) and "message" in doc:
                raise ApiError(int(doc.get("code", status)), str(doc.get("type", "Error")),
                               str(doc["message"]))
            raise ApiError(status, "Error", body.decode("utf-8", "replace").strip())
        if doc is None and body:
            raise ClientError(f"The management API answered {method} {path} with non-JSON "
                              f"content: {body[:200]!r}.")
        return doc

    def metrics(self) -> str:
        if not self.metrics_url:
            raise ClientError("No metrics address: pass --metrics-url or --log-dir of a running "
                              "daemon (one with enable_metrics_api=false serves none).")
        base = self.metrics_url.rstrip("/")
        path = "" if base.endswith("/metrics") else "/metrics"
        status, body, _ = self._request("GET", base, path, None, None, self.certificate_file)
        if status >= 400:
            raise ApiError(status, "Error", body.decode("utf-8", "replace").strip())
        return body.decode("utf-8", "replace")

    @staticmethod
    def _request(method: str, base: str, path: str, params: dict[str, Any] | None,
                 token: str | None, certificate_file: str | None, data: bytes | None = None
                 ) -> tuple[int, bytes, dict[str, str]]:
        url = base.rstrip("/") + path
        query = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data, method=method, headers=headers)
        try:
            context = client_context(certificate_file) if url.startswith("https:") else None
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT, context=context) as answer:
                return answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), dict(exc.headers or {})
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClientError(f"Cannot reach mservd at {base}: {reason}. Is it running? "
                              "Start it with 'mservd start'.") from None


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def connect(log_dir: str, management_url: str | None, metrics_url: str | None,
            token: str | None, *, need: str = "management") -> Client:
    """A ``Client`` from the state file, with the flags' overrides taking precedence.

    The state file may be missing only when the flag for the ``need``-ed API names its URL.
    """
    state: dict[str, Any] = {}
    state_file = Path(log_dir) / STATE_FILE
    given = management_url if need == "management" else metrics_url
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        if not given:
            raise ClientError(f"mservd is not running with log folder {log_dir!r}: no "
                              f"{state_file}. Start it with 'mservd start', or pass its "
                              f"--log-dir or --{need}-url.") from None
    except (OSError, ValueError) as exc:
        raise ClientError(f"Cannot read the state file {str(state_file)!r}: {exc}") from None
    addresses = state.get("addresses") or {}
    if token is None and need == "management" and state.get("key_file"):
        key_file = Path(state["key_file"])
        try:
            token = json.loads(key_file.read_text())["management"]["key"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ClientError(f"Cannot read the management key from {str(key_file)!r}: {exc}. "
                              "Pass it with --token.") from None
    return Client(management_url or addresses.get("management"),
                  metrics_url or addresses.get("metrics"), token, state.get("certificate_file"))


def client_options(*, metrics: bool = False) -> Callable:
    """Add --log-dir, the URL override (and --token for the management API); pass the
    command a ``client``."""

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(log_dir: str, token: str | None = None, management_url: str | None = None,
                    metrics_url: str | None = None, **kwargs: Any) -> Any:
            client = connect(log_dir, management_url, metrics_url, token,
                             need="metrics" if metrics else "management")
            return func(client, **kwargs)

        if metrics:  # the metrics API takes no token
            wrapper = click.option("--metrics-url", default=None, metavar="URL",
                                   help="The metrics API, e.g. http://127.0.0.1:8082 (default: "
                                        "from the state file).")(wrapper)
        else:
            wrapper = click.option("--token", default=None, metavar="KEY",
                                   help="The management key (default: read from the daemon's "
                                        "key file).")(wrapper)
            wrapper = click.option("--management-url", default=None, metavar="URL",
                                   help="The management API, e.g. http://127.0.0.1:8081 "
                                        "(default: from the state file).")(wrapper)
        wrapper = click.option("--log-dir", type=click.Path(file_okay=False), default="logs",
                               show_default=True,
                               help="The log folder of the daemon to talk to.")(wrapper)
        return wrapper

    return decorate


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print the API's JSON answer as it is, for scripts.")


def _print_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2))


def _print_status(answer: Any, as_json: bool) -> None:
    """A verb's ``{"status": ...}`` answer: the JSON as it is, or just the sentence."""
    if as_json:
        _print_json(answer)
    else:
        click.echo((answer or {}).get("status", ""))


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "") -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in cells)


def _path(model: str, version: str | None = None) -> str:
    quoted = "/models/" + urllib.parse.quote(model, safe="")
    return quoted + ("/" + urllib.parse.quote(version, safe="") if version else "")


# -- models ------------------------------------------------------------------------------


def all_pages(client: Client, path: str, key: str) -> list[dict[str, Any]]:
    """Every item of a paged list call (``GET /models``, ``GET /workflows``)."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = client.call("GET", path, {"limit": 1000, "next_page_token": token})
        items.extend(page.get(key, []))
        token = page.get("nextPageToken")
        if not token:
            return items


@click.group("models")
def models_group() -> None:
    """List, describe, register, scale and unregister models of a running daemon."""


@models_group.command("list")
@client_options()
@json_option
def list_command(client: Client, as_json: bool) -> None:
    """List the registered models: name, default version and archive."""
    models = all_pages(client, "/models", "models")
    if as_json:
        _print_json({"models": models})
        return
    if not models:
        click.echo("No models are registered.")
        return
    rows = []
    for entry in models:
        name = entry["modelName"]
        try:
            versions = client.call("GET", _path(name, "all"))
        except ApiError as exc:
            if exc.code != 404:  # unregistered between the two calls
                raise
            continue
        default = next((v["modelVersion"] for v in versions if v.get("isDefault")), "-")
        rows.append((name, default, entry.get("modelUrl", "")))
    click.echo(_table(("NAME", "DEFAULT VERSION", "URL"), rows))


@models_group.command("describe")
@click.argument("model")
@click.argument("version", required=False)
@click.option("--customized", is_flag=True,
              help="Ask the model's handler for its own metadata too (its describe_handle()).")
@client_options()
@json_option
def describe_command(client: Client, model: str, version: str | None, customized: bool,
                     as_json: bool) -> None:
    """Describe MODEL's default version, one VERSION, or all versions ('all')."""
    versions = client.call("GET", _path(model, version),
                           {"customized": "true"} if customized else None)
    if as_json:
        _print_json(versions)
        return
    click.echo("\n\n".join(_describe_block(desc) for desc in versions))


def _describe_block(desc: dict[str, Any]) -> str:
    default = " (default)" if desc.get("isDefault") else ""
    queue = desc.get("jobQueueStatus") or {}
    lines = [f"{desc['modelName']} {desc['modelVersion']}{default}"]
    settings = [
        ("url", desc.get("modelUrl", "")),
        ("runtime", desc.get("runtime", "")),
        ("workers", f"min {desc.get('minWorkers')}, max {desc.get('maxWorkers')}"),
        ("batch size", desc.get("batchSize")),
        ("max batch delay", f"{desc.get('maxBatchDelay')} ms"),
        ("response timeout", f"{desc.get('responseTimeout')} s"),
        ("startup timeout", f"{desc.get('startupTimeout')} s"),
        ("loaded at start", "yes" if desc.get("loadedAtStartup") else "no"),
        ("queue", (f"{queue.get('pendingRequests', 0)} pending, "
                   f"{queue.get('remainingCapacity', 0)} free")),
    ]
    if desc.get("batchSizeNow") is not None:
        settings.append(("batch size now", (f"{desc['batchSizeNow']}, delay "
                                            f"{desc.get('maxBatchDelayNow')} ms (auto)")))
    if desc.get("maxLatencyMs"):
        settings.append(("latency target", f"{desc['maxLatencyMs']} ms"))
    if desc.get("stateful"):
        idle, life = desc.get("sequenceMaxIdleMSec"), desc.get("sequenceTimeoutMSec")
        settings.append(("sequences", (
            f"{queue.get('openSequences', 0)} open of {desc.get('maxNumSequence')}, "
            f"{desc.get('maxSequenceJobQueueSize')} queued each at most, closed idle "
            f"{idle} ms" + (f" or {life} ms after opening" if life else ""))))
    cost = desc.get("batchCost")
    if cost:
        settings.append(("batch cost", (f"{cost['fixedMs']} ms + {cost['perItemMs']} ms per "
                                        f"request (r² {cost['r2']}, {cost['samples']} batches)")))
        advice = cost["advice"]
        settings.append(("advised", (f"batch {advice['batchSize']}, delay "
                                     f"{advice['maxBatchDelay']} ms: {advice['why']}")))
    if desc.get("loadError"):
        settings.append(("load error", desc["loadError"].splitlines()[0]))
    if "customizedMetadata" in desc:
        settings.append(("handler metadata", json.dumps(desc["customizedMetadata"])))
    width = max(len(key) for key, _ in settings) + 1
    lines += [f"  {key + ':':<{width}} {value}" for key, value in settings]
    workers = desc.get("workers") or []
    if workers:
        rows = [(w.get("id"), w.get("pid"), w.get("status"),
                 f"{(w.get('memoryUsage') or 0) / 2**20:.0f}",
                 w.get("gpuUsage") if w.get("gpu") else "-") for w in workers]
        lines.append(_table(("ID", "PID", "STATUS", "MEMORY MIB", "GPU"), rows, indent="  "))
    else:
        lines.append("  no workers")
    return "\n".join(lines)


@models_group.command("advise")
@click.argument("model")
@click.argument("version", required=False)
@click.option("--target-ms", type=click.FloatRange(min=0, min_open=True),
              help="The latency target to advise for (default: the model's maxLatencyMs).")
@client_options()
@json_option
def advise_command(client: Client, model: str, version: str | None, target_ms: float | None,
                   as_json: bool) -> None:
    """What batching does for MODEL: its fitted batch cost t(B) = c + m*B, the speed-up
    S(B) = B(c+m)/(c+Bm) with its ceiling 1 + c/m, a worker's throughput B/(c+Bm) beside the
    throughput measured at each size, and the batch size and delay advised (within the latency
    target, if any)."""
    from mservd.core.advisor import Fit, Measured, advise, curve

    desc = client.call("GET", _path(model, version))[0]
    cost = desc.get("batchCost")
    if not cost:
        raise click.ClickException(
            f"No fit yet for {desc['modelName']} {desc['modelVersion']}: the advisor needs "
            "16 batches of at least two sizes. Send it concurrent requests and ask again.")
    fit = Fit(cost["fixedMs"] / 1e3, cost["perItemMs"] / 1e3, cost["r2"], cost["samples"],
              cost["batchSizes"])
    measured = {m["batchSize"]: Measured(m["batchSize"], m["batches"], m["items"],
                                         m["batchMs"] * m["batches"] / 1e3)
                for m in cost.get("measured", [])}
    target = target_ms if target_ms is not None else desc.get("maxLatencyMs")
    advice = advise(fit, target / 1e3 if target else None, measured=measured)
    points = curve(fit)
    if as_json:
        _print_json({"model": desc["modelName"], "version": desc["modelVersion"], **cost,
                     "targetMs": target, "curve": points, "advice": advice.to_dict()})
        return
    click.echo(f"{desc['modelName']} {desc['modelVersion']}: a batch of B takes "
               f"{cost['fixedMs']} ms + {cost['perItemMs']} ms x B "
               f"(r² {cost['r2']}, from {cost['samples']} batches of {cost['batchSizes']} sizes)")
    click.echo(f"speed-up ceiling 1 + c/m = {fit.ceiling:.1f}x")
    rows = [(p["batchSize"], f"{p['speedup']:.2f}x", f"{p['throughput']:.1f}",
             f"{p['batchMs']:.2f}", _measured_cell(measured.get(p["batchSize"])))
            for p in points]
    click.echo(_table(("BATCH", "SPEED-UP S(B)", "REQ/S PER WORKER", "BATCH MS",
                       "MEASURED REQ/S (BATCHES)"), rows))
    where = f" for a {target:g} ms target" if target else ""
    click.echo(f"advised{where}: batch size {advice.batch_size}, max batch delay "
               f"{advice.max_batch_delay_ms} ms — {advice.why}")


def _measured_cell(measured) -> str:
    """A size's measured throughput per worker and how many recent batches it is from."""
    return "-" if measured is None else f"{measured.throughput:.1f} ({measured.batches})"


@models_group.command("register")
@click.argument("url")
@click.option("--model-name", help="Register under this name instead of the archive's.")
@click.option("--handler", help="Use this handler instead of the archive's.")
@click.option("--batch-size", type=click.IntRange(min=1))
@click.option("--max-batch-delay", type=click.IntRange(min=0), help="Milliseconds.")
@click.option("--initial-workers", type=click.IntRange(min=0))
@click.option("--response-timeout", type=click.IntRange(min=1), help="Seconds.")
@click.option("--startup-timeout", type=click.IntRange(min=1), help="Seconds.")
@click.option("--synchronous/--no-synchronous", default=True, show_default=True,
              help="Wait, showing progress, until the initial workers are ready.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="Seconds to wait for the workers (default: the model's startup timeout "
                   "+ 5).")
@client_options()
@json_option
def register_command(client: Client, url: str, model_name: str | None, handler: str | None,
                     batch_size: int | None, max_batch_delay: int | None,
                     initial_workers: int | None, response_timeout: int | None,
                     startup_timeout: int | None, synchronous: bool, timeout: float | None,
                     as_json: bool) -> None:
    """Register the archive URL (a file in the model store, or an allowed http(s) URL)."""
    params = {"url": url, "model_name": model_name, "handler": handler, "batch_size": batch_size,
              "max_batch_delay": max_batch_delay, "initial_workers": initial_workers,
              "response_timeout": response_timeout, "startup_timeout": startup_timeout,
              "synchronous": False}
    answer = client.call("POST", "/models", params)
    status = str((answer or {}).get("status", ""))
    match = _REGISTERED.match(status)
    if synchronous and match and int(match["workers"]) > 0:
        name, version = match["name"], match["version"]
        _wait_for_workers(client, name, version, timeout, unregister_on_failure=True)
    _print_status(answer, as_json)


@models_group.command("scale")
@click.argument("model")
@click.argument("version", required=False)
@click.option("--min-worker", type=click.IntRange(min=0), required=True,
              help="The number of workers to run.")
@click.option("--max-worker", type=click.IntRange(min=0), help="At least --min-worker.")
@click.option("--synchronous", is_flag=True,
              help="Wait, showing progress, until the workers are ready.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="Seconds to wait (default: the model's startup timeout + 5).")
@client_options()
@json_option
def scale_command(client: Client, model: str, version: str | None, min_worker: int,
                  max_worker: int | None, synchronous: bool, timeout: float | None,
                  as_json: bool) -> None:
    """Scale MODEL's default version (or VERSION) to --min-worker workers."""
    answer = client.call("PUT", _path(model, version),
                         {"min_worker": min_worker, "max_worker": max_worker,
                          "synchronous": False})
    if synchronous:
        _wait_for_workers(client, model, version, timeout, unregister_on_failure=False)
        answer = {"status": f"Workers scaled to {min_worker} for model: {model}"
                            + (f", version: {version}" if version else "")}
    _print_status(answer, as_json)


def _wait_for_workers(client: Client, model: str, version: str | None, timeout: float | None,
                      *, unregister_on_failure: bool) -> None:
    """Poll describe until the target workers are READY; progress lines go to stderr."""
    start = time.monotonic()
    deadline: float | None = None if timeout is None else start + timeout
    last: tuple[int, int] | None = None
    last_shown = 0.0
    while True:
        [desc] = client.call("GET", _path(model, version))
        version = desc["modelVersion"]
        target = int(desc.get("minWorkers", 0))
        workers = desc.get("workers") or []
        ready = sum(1 for w in workers if w.get("status") == "READY")
        now = time.monotonic()
        if deadline is None:
            deadline = start + float(desc.get("startupTimeout") or 120) + 5
        if (ready, target) != last or now - last_shown >= PROGRESS_EVERY:
            click.echo(f"workers ready {ready}/{target} ({model} {version}, "
                       f"{now - start:.0f} s)", err=True)
            last, last_shown = (ready, target), now
        if ready >= target and len(workers) == target:
            return
        live = [w for w in workers if w.get("status") != "STOPPING"]
        if desc.get("loadError") and not live:
            _failed(client, desc, unregister_on_failure)
        if now >= deadline:
            raise ClientError(f"Workers for model {model} version {version} were not ready "
                              f"within {deadline - start:.0f} s ({ready}/{target} ready). "
                              f"See the model's log, or 'mservd models describe {model} "
                              f"{version}'.")
        time.sleep(POLL_INTERVAL)


def _failed(client: Client, desc: dict[str, Any], unregister: bool) -> None:
    """Report a failed load as the synchronous API would, and remove a failed registration."""
    name, version = desc["modelName"], desc["modelVersion"]
    error = str(desc["loadError"]).strip()
    if unregister:  # as a synchronous register does on the server: nothing is left behind
        try:
            client.call("DELETE", _path(name, version))
        except ApiError:
            pass
    if "\n" in error:
        click.echo(error, err=True)
    raise ApiError(500, "InternalServerException",
                   f"Failed to start workers for model {name} version: {version}: "
                   f"{error.splitlines()[0]}")


@models_group.command("unregister")
@click.argument("model")
@click.argument("version", required=False)
@client_options()
@json_option
def unregister_command(client: Client, model: str, version: str | None, as_json: bool) -> None:
    """Unregister MODEL's default version, or VERSION, and stop its workers."""
    _print_status(client.call("DELETE", _path(model, version)), as_json)


@models_group.command("set-default")
@click.argument("model")
@click.argument("version")
@client_options()
@json_option
def set_default_command(client: Client, model: str, version: str, as_json: bool) -> None:
    """Make VERSION the version that answers MODEL's requests."""
    _print_status(client.call("PUT", _path(model, version) + "/set-default"), as_json)


def _version_numbers(pairs: Sequence[str], what: str) -> dict[str, float]:
    """``VERSION=NUMBER`` arguments as {version: number}; a bad one is a usage error."""
    out: dict[str, float] = {}
    for pair in pairs:
        version, _, number = pair.partition("=")
        try:
            out[version] = float(number)
        except ValueError:
            raise click.BadParameter(f"{pair!r} is not VERSION=NUMBER (e.g. 2.0=10).",
                                     param_hint=what) from None
        if not version:
            raise click.BadParameter(f"{pair!r} names no version.", param_hint=what)
    return out


@models_group.command("traffic")
@click.argument("model")
@click.argument("weights", nargs=-1, metavar="[VERSION=WEIGHT]...")
@click.option("--sticky", is_flag=True, help="One traffic key (the x-traffic-key header, "
              "traffic_key_header) always sees one version.")
@click.option("--shadow", multiple=True, metavar="VERSION=PERCENT",
              help="Copy this share of requests to VERSION; its answers are discarded.")
@click.option("--max-error-rate", multiple=True, metavar="VERSION=RATE",
              help="Take VERSION's traffic away while its 5xx rate passes RATE (0..1).")
@click.option("--clear", is_flag=True, help="Remove the policy: the default version serves.")
@client_options()
@json_option
def traffic_command(client: Client, model: str, weights: tuple[str, ...], sticky: bool,
                    shadow: tuple[str, ...], max_error_rate: tuple[str, ...], clear: bool,
                    as_json: bool) -> None:
    """Share MODEL's unversioned requests among its versions (mservd models traffic m
    1.0=90 2.0=10), remove the policy (--clear), or show it and each version's state (no
    WEIGHT)."""
    path = _path(model) + "/traffic"
    if clear:
        _print_status(client.call("DELETE", path), as_json)
        return
    if weights:
        document = {"weights": _version_numbers(weights, "WEIGHT"), "sticky": sticky,
                    "shadow": _version_numbers(shadow, "--shadow"),
                    "maxErrorRate": _version_numbers(max_error_rate, "--max-error-rate")}
        _print_status(client.call("PUT", path, body=document), as_json)
        return
    doc = client.call("GET", path)
    if as_json:
        _print_json(doc)
        return
    click.echo(f"{model}: {'sticky ' if doc.get('sticky') else ''}"
               f"{'policy' if doc.get('policy') else 'no policy (the default version serves)'}")
    click.echo(_table(["VERSION", "SHARE %", "SHADOW %", "STATE", "ERROR RATE", "LIVE"], [
        [v["modelVersion"], v["share"], v.get("shadowPercent", "-"), v["state"],
         v.get("errorRate", "-"), v["liveWorkers"]] for v in doc["versions"]], indent="  "))


# -- metrics -----------------------------------------------------------------------------


@click.command("metrics")
@click.argument("names", nargs=-1)
@client_options(metrics=True)
def metrics_command(client: Client, names: tuple[str, ...]) -> None:
    """Print the daemon's metrics (Prometheus text); only the families NAMES if given."""
    text = client.metrics()
    if names:
        text = "".join(line + "\n" for line in text.splitlines() if _wanted(line, names))
    click.echo(text, nl=False)


def _wanted(line: str, names: tuple[str, ...]) -> bool:
    """Whether a sample, or a family's HELP/TYPE line, belongs to a metric named ``names``."""
    if line.startswith("#"):
        parts = line.split()
        family = parts[2] if len(parts) > 2 else ""
        # a counter family "x" has samples "x_total": asking for either keeps its HELP/TYPE
        return bool(family) and any(family.startswith(n) or n.startswith(family + "_")
                                    for n in names)
    return any(re.split(r"[{\s]", line, maxsplit=1)[0].startswith(n) for n in names)


__all__ = ["ApiError", "Client", "ClientError", "connect", "metrics_command", "models_group"]
