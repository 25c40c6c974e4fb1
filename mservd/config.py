"""Server and per-model settings: where every value comes from, and its one precedence order.

This module owns the daemon's settings. :func:`load` resolves server settings as
defaults → ``config.properties`` → ``TS_<KEY>`` environment variables (only when
``enable_envvars_config`` is on) → command-line overrides, and returns one frozen
:class:`Settings`. :func:`resolve_model_settings` resolves one model version's settings as
defaults → the ``models=`` block of ``config.properties`` → the archive's
``model-config.yaml`` → the management API call, and returns one frozen :class:`ModelSettings`.

Both collect every problem before raising one :class:`ConfigError`, so a user fixes a file in
one pass. Each :class:`Settings` field declares its ``config.properties`` key and doc in its
``metadata``; that is the only list of keys (:func:`describe_settings` renders it for ``--help``).

It must not keep state: no module-level settings object, no caching. ``Settings`` is passed
explicitly to whoever needs it. It does no IO beyond reading the files it is named.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import types
import typing
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mservd.errors import short_repr

logger = logging.getLogger(__name__)

__all__ = [
    "ConfigError",
    "ModelSettings",
    "Settings",
    "describe_settings",
    "load",
    "parse_address",
    "parse_properties",
    "read_model_yaml",
    "resolve_model_settings",
]


class ConfigError(Exception):
    """Settings that cannot be used, every bad key listed at once.

    :param problems: one line per bad key, each naming the key (and where it came from when that
        is not ``config.properties``), the value and what is valid.
    :param title: the first line of the message.
    """

    def __init__(self, problems: Sequence[str], *, title: str = "Invalid configuration") -> None:
        self.problems: list[str] = list(problems)
        self.title = title
        super().__init__(f"{title}:\n" + "\n".join(f"  {p}" for p in self.problems))


# --- value conversion ---------------------------------------------------------------------
# A converter takes a raw value (a string from a file or the environment, or an already typed
# value from the command line or JSON/YAML) and returns the typed value, or raises ValueError
# whose message completes the line "<key>: <message>".

Convert = Callable[[Any], Any]


INT_LIMIT = 2**53  # no count, size or duration here means more; a clock plus it stays a float


def to_int(value: Any) -> int:
    """An integer setting or parameter: an int, or its decimal digits (a sign allowed)."""
    number = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        digits = value.strip()
        number = int(digits) if len(digits) <= 20 else INT_LIMIT + 1
    if number is None:
        raise ValueError(f"{short_repr(value)} is not an integer")
    if abs(number) > INT_LIMIT:
        raise ValueError(f"an integer of at most {INT_LIMIT} is needed; this one is larger")
    return number


_DIGITS = re.compile(r"[+-]?[0-9]+")


def _to_float(value: Any) -> float:
    result: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value) if abs(value) <= INT_LIMIT else None
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            pass
    if result is None or not math.isfinite(result):
        raise ValueError(f"{short_repr(value)} is not a number")
    return result


def to_bool(value: Any) -> bool:
    """A boolean setting or parameter, one spelling everywhere: true or false, any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{short_repr(value)} is not a boolean (use true or false)")


def _to_str(value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        return value.strip()
    raise ValueError(f"{short_repr(value)} is not a string")


def _to_str_tuple(value: Any) -> tuple[str, ...]:
    """A comma-separated list (TorchServe's list syntax) or a sequence of strings."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ValueError(f"{short_repr(value)} is not a comma-separated list")
    return tuple(item.strip() for item in items if item.strip())


def _to_json_object(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON: {exc}") from None
    if isinstance(value, Mapping):
        return dict(value)
    raise ValueError(f"must be a JSON object, got {type(value).__name__}")


def _optional(convert: Convert) -> Convert:
    """An empty value means "not set" (``number_of_gpu=`` leaves GPU detection on)."""

    def optional(value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return convert(value)

    return optional


def _converter_for(hint: Any) -> Convert:
    """The converter for a Settings field's declared type; parsing follows the type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _optional(_converter_for(inner))
    if hint is bool:
        return to_bool
    if hint is int:
        return to_int
    if hint is float:
        return _to_float
    if hint is str:
        return _to_str
    if origin is tuple:
        return _to_str_tuple
    if origin in (dict, Mapping) or hint is dict:
        return _to_json_object
    raise TypeError(f"no converter for settings type {hint!r}")


# --- checks on converted values -------------------------------------------------------------
# A check takes the converted value and returns it (possibly normalised) or raises ValueError.


def _at_least(minimum: float) -> Convert:
    def at_least(value: Any) -> Any:
        if value is not None and value < minimum:
            raise ValueError(f"{short_repr(value)} must be >= {minimum}")
        return value

    return at_least


def _above(minimum: float) -> Convert:
    def above(value: Any) -> Any:
        if value is not None and value <= minimum:
            raise ValueError(f"{short_repr(value)} must be > {minimum}")
        return value

    return above


def _between(low: float, high: float) -> Convert:
    def between(value: Any) -> Any:
        if value is not None and not low <= value <= high:
            raise ValueError(f"{short_repr(value)} must be from {low} to {high}")
        return value

    return between


def _port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise ValueError(f"{short_repr(value)} is not a port (0-65535; 0 picks a free port)")
    return value


def _one_of(*choices: str, upper: bool = False) -> Convert:
    def one_of(value: str) -> str:
        normal = value.upper() if upper else value.lower()
        if normal not in choices:
            raise ValueError(f"{short_repr(value)} is not one of {', '.join(choices)}")
        return normal

    return one_of


def parse_address(address: str) -> tuple[str, str, int]:
    """Split an ``http(s)://host:port`` address into ``(scheme, host, port)``.

    The frontends bind what this returns; port 0 asks the OS for a free port. IPv6 hosts are
    written in brackets (``http://[::1]:8080``) and returned without them.

    :raises ValueError: the address is not ``http(s)://host:port``; the message says so.
    """
    bad = ValueError(f"{address!r} is not an http(s)://host:port address (port 0-65535)")
    try:
        parts = urllib.parse.urlsplit(address)
        port = parts.port
    except ValueError:
        raise bad from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or port is None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise bad
    return parts.scheme, parts.hostname, port


def _address(value: str) -> str:
    parse_address(value)
    return value


def _regex_list(value: tuple[str, ...]) -> tuple[str, ...]:
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None
    return value


def _regex(value: str) -> str:
    _regex_list((value,))
    return value


def _load_models(value: tuple[str, ...]) -> tuple[str, ...]:
    # TorchServe images ship "load_models=standalone"; it means nothing to load.
    if len(value) == 1 and value[0].lower() == "standalone":
        return ()
    return value


def _metrics_yaml(value: str) -> str:
    if value:
        read_model_metrics(value)  # a bad file stops the start, not the first get_metric
    return value


class _Problems(ValueError):
    """Several problems in one value (the ``models=`` block), reported one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _models_block(value: dict[str, Any]) -> dict[str, Any]:
    """The ``models=`` block must be {name: {version: {setting: value}}}; values are checked too,
    so a bad entry is reported at start-up rather than when the model loads."""
    problems: list[str] = []
    for name, versions in value.items():
        if not isinstance(versions, Mapping):
            kind = type(versions).__name__
            problems.append(f"model {name!r} must be an object of versions, got {kind}")
            continue
        for version, entry in versions.items():
            where = f"model {name!r} version {version!r}"
            if not isinstance(entry, Mapping):
                kind = type(entry).__name__
                problems.append(f"{where} must be an object of settings, got {kind}")
                continue
            _convert_layer(entry, _MODELS_BLOCK_KEYS, where, problems, {})
    if problems:
        raise _Problems(problems)
    return value


def _chain(*steps: Convert) -> Convert:
    def chained(value: Any) -> Any:
        for step in steps:
            value = step(value)
        return value

    return chained


def _meta(key: str, doc: str, check: Convert | None = None) -> dict[str, Any]:
    return {"key": key, "doc": doc, "check": check}


# --- server settings --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The daemon's resolved settings. Build it with :func:`load`; pass it explicitly.

    Every field with a ``key`` in its metadata is a ``config.properties`` key (and a ``TS_<KEY>``
    variable). ``extra`` holds the file's keys mservd does not use; ``config_file`` names where
    the properties came from, for messages.
    """

    inference_address: str = field(
        default="http://127.0.0.1:8080",
        metadata=_meta(
            "inference_address",
            "Inference API address, http(s)://host:port (port 0 picks a free port).",
            _address,
        ),
    )
    management_address: str = field(
        default="http://127.0.0.1:8081",
        metadata=_meta(
            "management_address",
            "Management API address, http(s)://host:port (port 0 picks a free port).",
            _address,
        ),
    )
    metrics_address: str = field(
        default="http://127.0.0.1:8082",
        metadata=_meta(
            "metrics_address",
            "Metrics API address, http(s)://host:port (port 0 picks a free port).",
            _address,
        ),
    )
    grpc_inference_port: int = field(
        default=7070,
        metadata=_meta("grpc_inference_port", "gRPC inference port on loopback.", _port),
    )
    grpc_management_port: int = field(
        default=7071,
        metadata=_meta("grpc_management_port", "gRPC management port on loopback.", _port),
    )
    enable_metrics_api: bool = field(
        default=True,
        metadata=_meta(
            "enable_metrics_api",
            "Serve the metrics API on metrics_address; false: no metrics port at all.",
        ),
    )
    cors_allowed_origin: str = field(
        default="",
        metadata=_meta(
            "cors_allowed_origin",
            "Turns CORS on: every HTTP answer carries Access-Control-Allow-Origin with this "
            "value ('*' or an origin), and a browser's preflight (OPTIONS) is answered 200.",
        ),
    )
    cors_allowed_methods: str = field(
        default="",
        metadata=_meta("cors_allowed_methods",
                       "Access-Control-Allow-Methods for CORS answers, e.g. GET, POST."),
    )
    cors_allowed_headers: str = field(
        default="",
        metadata=_meta("cors_allowed_headers",
                       "Access-Control-Allow-Headers for CORS answers, e.g. Authorization."),
    )
    certificate_file: str = field(
        default="",
        metadata=_meta(
            "certificate_file",
            "The X.509 certificate chain (PEM) the https:// addresses (and the gRPC ports "
            "with enable_grpc_ssl) serve.",
        ),
    )
    private_key_file: str = field(
        default="",
        metadata=_meta("private_key_file", "The private key (PEM) of certificate_file."),
    )
    enable_grpc_ssl: bool = field(
        default=False,
        metadata=_meta(
            "enable_grpc_ssl",
            "Serve the gRPC ports over TLS with certificate_file and private_key_file.",
        ),
    )
    model_store: str | None = field(
        default=None,
        metadata=_meta("model_store", "Folder holding the model archives (.mar)."),
    )
    load_models: tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "load_models",
            "Archives to load at start: 'all', 'a.mar,b.mar' or 'name=a.mar' items, "
            "comma-separated; empty or 'standalone' loads none.",
            _load_models,
        ),
    )
    default_workers_per_model: int = field(
        default=0,
        metadata=_meta(
            "default_workers_per_model",
            "Workers per model when nothing else says; 0 means one per GPU, or 1 on CPU.",
            _at_least(0),
        ),
    )
    job_queue_size: int = field(
        default=100,
        metadata=_meta(
            "job_queue_size",
            "Requests a model may hold waiting for a worker before answering 503.",
            _at_least(1),
        ),
    )
    default_response_timeout: int = field(
        default=120,
        metadata=_meta(
            "default_response_timeout",
            "Seconds a worker may take on one batch before it is killed.",
            _above(0),
        ),
    )
    default_startup_timeout: int = field(
        default=120,
        metadata=_meta(
            "default_startup_timeout",
            "Seconds a worker may take to load its model.",
            _above(0),
        ),
    )
    max_request_size: int = field(
        default=6553500,
        metadata=_meta("max_request_size", "Largest request body in bytes (413 above).", _above(0)),
    )
    max_response_size: int = field(
        default=6553500,
        metadata=_meta("max_response_size", "Largest response body in bytes.", _above(0)),
    )
    number_of_gpu: int | None = field(
        default=None,
        metadata=_meta(
            "number_of_gpu",
            "Most GPUs to use; empty detects them all.",
            _at_least(0),
        ),
    )
    batch_size: int = field(
        default=1,
        metadata=_meta("batch_size", "Default largest batch per model.", _at_least(1)),
    )
    max_batch_delay: int = field(
        default=100,
        metadata=_meta(
            "max_batch_delay",
            "Default milliseconds a batch waits to fill before it is sent.",
            _at_least(0),
        ),
    )
    enable_envvars_config: bool = field(
        default=False,
        metadata=_meta(
            "enable_envvars_config",
            "Let TS_<KEY> environment variables override config.properties.",
        ),
    )
    enable_model_api: bool = field(
        default=False,
        metadata=_meta(
            "enable_model_api",
            "Allow registering and unregistering models through the management API.",
        ),
    )
    disable_token_authorization: bool = field(
        default=False,
        metadata=_meta(
            "disable_token_authorization",
            "Serve without bearer tokens (key_file.json is not written).",
        ),
    )
    token_expiration_min: float = field(
        default=60.0,
        metadata=_meta(
            "token_expiration_min",
            "Minutes before inference and management keys expire.",
            _above(0),
        ),
    )
    allowed_urls: tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "allowed_urls",
            "Comma-separated regular expressions; a model URL must match one to be downloaded.",
            _regex_list,
        ),
    )
    decode_input_request: bool = field(
        default=True,
        metadata=_meta(
            "decode_input_request",
            "Hand a handler JSON inputs parsed and text inputs as str (true), or every input "
            "as the bytes sent (false); TorchServe's /predictions inputs only.",
        ),
    )
    blacklist_env_vars: str = field(
        default="",
        metadata=_meta(
            "blacklist_env_vars",
            "A regular expression: environment variables whose whole name matches it are "
            "hidden from the workers (and so from handler code); empty: none.",
            _regex,
        ),
    )
    metrics_mode: str = field(
        default="prometheus",
        metadata=_meta(
            "metrics_mode",
            "Where metrics go: prometheus (the metrics API) or log.",
            _one_of("prometheus", "log"),
        ),
    )
    metrics_config: str = field(
        default="",
        metadata=_meta(
            "metrics_config",
            "A metrics.yaml in TorchServe's format: the metrics under its model_metrics are "
            "declared in every handler (context.metrics.get_metric finds them); empty: "
            "TorchServe's defaults, HandlerTime and PredictionTime.",
            _metrics_yaml,
        ),
    )
    install_py_dep_per_model: bool = field(
        default=False,
        metadata=_meta(
            "install_py_dep_per_model",
            "pip-install an archive's requirements file when its model loads.",
        ),
    )
    log_dir: str = field(
        default="logs",
        metadata=_meta("log_dir", "Folder for logs and config snapshots."),
    )
    snapshot: bool = field(
        default=True,
        metadata=_meta(
            "enable_snapshot",
            "Write the model registry under <log_dir>/config/ and restore it at start "
            "(--ncs turns it off).",
        ),
    )
    frontend_workers: int = field(
        default=2,
        metadata=_meta(
            "frontend_workers",
            "HTTP frontend worker processes under gunicorn's arbiter; each serves the "
            "inference, management and metrics ports.",
            _at_least(1),
        ),
    )
    lend_idle_workers: bool = field(
        default=True,
        metadata=_meta(
            "lend_idle_workers",
            "While a model version serves a lone client, lend its idle worker to that client's "
            "frontend, which then sends it requests past the controller (lower latency; "
            "docs/architecture.md). Such requests reach the counters within 10 ms of their "
            "answer, not on arrival; false sends every request through the controller's queue.",
        ),
    )
    frontend_connections: int = field(
        default=1000,
        metadata=_meta(
            "frontend_connections",
            "Simultaneous connections each HTTP frontend worker keeps open on the inference "
            "port, and as many again on the management and metrics ports (counted apart, so a "
            "flood of one cannot lock out the other), and each gRPC port; past it a new "
            "connection is closed.",
            _at_least(1),
        ),
    )
    max_workers_per_model: int = field(
        default=32,
        metadata=_meta(
            "max_workers_per_model",
            "Most workers one model version may have (min_worker, max_worker, "
            "initial_workers, default_workers_per_model); 400 above.",
            _at_least(1),
        ),
    )
    max_workers_total: int = field(
        default=128,
        metadata=_meta(
            "max_workers_total",
            "Most workers all model versions may have together; a register or scale call "
            "that would pass it is 400.",
            _at_least(1),
        ),
    )
    max_sequences_per_client: int = field(
        default=0,
        metadata=_meta(
            "max_sequences_per_client",
            "Most sequences of one stateful model version (sequenceBatching) one client (its "
            "address: an IPv4 address, an IPv6 /64) may hold open; past it a new sequence is "
            "refused 503. 0: half of the version's maxNumSequence, rounded up, so that no "
            "one client fills it.",
            _at_least(0),
        ),
    )
    frontend_keepalive: float = field(
        default=5.0,
        metadata=_meta(
            "frontend_keepalive",
            "Seconds an HTTP connection may sit silent between requests (gunicorn's "
            "keepalive); the next request's headers must be whole by then.",
            _above(0),
        ),
    )
    frontend_header_timeout: float = field(
        default=10.0,
        metadata=_meta(
            "frontend_header_timeout",
            "Seconds a new HTTP connection has to send its first request's headers, else 408 "
            "and closed (slow clients cannot hold connections open); a gRPC connection has as "
            "long to send its HTTP/2 settings. A TLS handshake counts in it.",
            _above(0),
        ),
    )
    frontend_body_timeout: float = field(
        default=60.0,
        metadata=_meta(
            "frontend_body_timeout",
            "Seconds an HTTP request body may take from the end of its head, else 408 and "
            "closed.",
            _above(0),
        ),
    )
    frontend_body_bytes: int = field(
        default=1 << 30,
        metadata=_meta(
            "frontend_body_bytes",
            "Bytes of request bodies each HTTP frontend worker holds at once, counted from "
            "the first byte read until the answer is sent; a body that would pass it is "
            "refused 503 before more of it is read (a lone body is always taken).",
            _at_least(1),
        ),
    )
    frontend_write_timeout: float = field(
        default=30.0,
        metadata=_meta(
            "frontend_write_timeout",
            "Seconds an HTTP or gRPC streaming client may stop reading its answers before its "
            "connection (HTTP) or call (gRPC) is ended (answers are not buffered for it "
            "meanwhile).",
            _above(0),
        ),
    )
    unknown_token_limit: int = field(
        default=8,
        metadata=_meta(
            "unknown_token_limit",
            "Unknown bearer tokens one client address (IPv6: its /64) may have waiting for the "
            "controller's check at once, per frontend process; past it 503 with Retry-After, "
            "without asking the controller.",
            _at_least(1),
        ),
    )
    frontend_timeout: float = field(
        default=30.0,
        metadata=_meta(
            "frontend_timeout",
            "Seconds an HTTP frontend worker's event loop may stall before gunicorn replaces "
            "the worker (gunicorn's timeout); also the longest pause inside a request body.",
            _above(0),
        ),
    )
    limit_request_line: int = field(
        default=8190,
        metadata=_meta(
            "limit_request_line",
            "Longest HTTP request line in bytes (414 above), checked as it arrives; at most "
            "8190 (gunicorn's limit_request_line).",
            _between(64, 8190),
        ),
    )
    limit_request_fields: int = field(
        default=100,
        metadata=_meta(
            "limit_request_fields",
            "Most header fields in an HTTP request (431 above; gunicorn's "
            "limit_request_fields).",
            _between(1, 32768),
        ),
    )
    limit_request_header_bytes: int = field(
        default=65536,
        metadata=_meta(
            "limit_request_header_bytes",
            "Largest HTTP request head in bytes, request line and headers together (431 "
            "above), checked as it arrives.",
            _between(1024, 1 << 24),
        ),
    )
    limit_request_field_size: int = field(
        default=8190,
        metadata=_meta(
            "limit_request_field_size",
            "Longest HTTP header field in bytes, name and value (431 above), checked as it "
            "arrives (gunicorn's limit_request_field_size).",
            _between(64, 65536),
        ),
    )
    shed_delay_ms: int = field(
        default=0,
        metadata=_meta(
            "shed_delay_ms",
            "While an inference server process runs this many ms behind, new predictions get "
            "503 at once instead of waiting (0, the default, turns it off; 20 suits a server "
            "that must shed overload in milliseconds).",
            _at_least(0),
        ),
    )
    max_archive_bytes: int = field(
        default=4 * 1024**3,
        metadata=_meta("max_archive_bytes", "Largest unpacked archive in bytes.", _above(0)),
    )
    max_archive_files: int = field(
        default=10000,
        metadata=_meta("max_archive_files", "Most files an archive may hold.", _above(0)),
    )
    max_queue_wait_ms: int = field(
        default=0,
        metadata=_meta(
            "max_queue_wait_ms",
            "When the oldest request queued for a model has waited this many ms beyond its "
            "max_batch_delay (or four of the model's batch times, if longer), new requests for it "
            "are refused at once with 503 and Retry-After instead of queueing. Each HTTP frontend "
            "also keeps a fast model's predictions in flight to what it answers in this time, "
            "and to what it answers in a third of it once more arrive than it answers. 0, the "
            "default, turns both off: a request is then refused only when its model's queue is "
            "full or it cannot be answered within its deadline (or a model's maxLatencyMs).",
            _at_least(0),
        ),
    )
    default_request_timeout_ms: int = field(
        default=0,
        metadata=_meta(
            "default_request_timeout_ms",
            "Milliseconds a request may wait in a queue before it is answered 504 without being "
            "computed; 0 means the model's response timeout. A request can ask for less with "
            "the X-Request-Timeout-Ms header.",
            _at_least(0),
        ),
    )
    drain_timeout: float = field(
        default=30.0,
        metadata=_meta(
            "drain_timeout",
            "Seconds a stop waits for requests in flight before killing workers.",
            _at_least(0),
        ),
    )
    log_level: str = field(
        default="INFO",
        metadata=_meta(
            "log_level",
            "DEBUG, INFO, WARNING, ERROR or CRITICAL.",
            _one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", upper=True),
        ),
    )
    log_format: str = field(
        default="plain",
        metadata=_meta("log_format", "plain or json log lines.", _one_of("plain", "json")),
    )
    log_max_bytes: int = field(
        default=100 * 1024 * 1024,
        metadata=_meta(
            "log_max_bytes",
            "A log file past this size is copied to <name>.1 and emptied (0: never), as "
            "TorchServe's log4j2 rolls its logs at 100 MB.",
            _at_least(0),
        ),
    )
    log_backup_count: int = field(
        default=5,
        metadata=_meta(
            "log_backup_count",
            "Rotated copies kept of each log file (<name>.1 the newest).",
            _at_least(0),
        ),
    )
    models: Mapping[str, Any] = field(
        default_factory=dict,
        metadata=_meta(
            "models",
            'Per-model settings as JSON: {"name": {"version": {"defaultVersion": true, '
            '"marName": "name.mar", "minWorkers": 1, "maxWorkers": 1, "batchSize": 4, '
            '"maxBatchDelay": 100, "responseTimeout": 120}}}.',
            _models_block,
        ),
    )
    extra: Mapping[str, str] = field(default_factory=dict)
    config_file: str | None = None


def _keyed_fields() -> list[tuple[dataclasses.Field[Any], Convert]]:
    """Settings fields that are config keys, each with its converter (type, then check)."""
    hints = typing.get_type_hints(Settings)
    result = []
    for f in dataclasses.fields(Settings):
        if "key" not in f.metadata:
            continue
        convert = _converter_for(hints[f.name])
        check = f.metadata.get("check")
        result.append((f, _chain(convert, check) if check else convert))
    return result


def _render(value: Any) -> str:
    """A value written the way config.properties writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, Mapping):
        return json.dumps(value)
    return str(value)


def describe_settings() -> list[tuple[str, str, str]]:
    """``(key, default, doc)`` for every config.properties key, for ``--help`` and docs."""
    rows = []
    for f, _ in _keyed_fields():
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        rows.append((f.metadata["key"], _render(default), f.metadata["doc"]))
    return rows


# --- config.properties ----------------------------------------------------------------------

_ESCAPES: Mapping[str, str] = types.MappingProxyType({"t": "\t", "n": "\n", "r": "\r", "f": "\f"})


def _logical_lines(text: str) -> list[str]:
    """Join continued lines the way java.util.Properties does.

    A line ending in an odd number of backslashes continues on the next, whose leading
    whitespace is dropped. Comment lines never continue, so a commented-out ``models=`` block
    needs ``#`` on every line. Unlike Java, whitespace after the backslash is forgiven: it is
    invisible in an editor and would silently cut a ``models=`` block short.
    """
    lines: list[str] = []
    current: str | None = None
    for raw in text.splitlines():
        line = (raw if current is None else raw.lstrip()).rstrip()
        if current is None:
            stripped = line.lstrip()
            if not stripped or stripped[0] in "#!":
                continue
            line = stripped
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            current = (current or "") + line[:-1]
            continue
        lines.append((current or "") + line)
        current = None
    if current is not None:
        lines.append(current)
    return lines


def _unescape(text: str) -> str:
    """Java properties escapes: ``\\t \\n \\r \\f \\uXXXX``, and ``\\x`` → ``x`` otherwise."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 >= len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
            out.append(chr(int(text[i + 2 : i + 6], 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def parse_properties(text: str) -> dict[str, str]:
    """The keys and values of a config.properties text, in the subset TorchServe files use.

    ``key=value``, ``key: value`` and ``key value``; ``#`` and ``!`` comment lines; blank lines;
    a trailing backslash continues a value on the next line (how multi-line ``models=`` blocks
    are written); keys and values are trimmed; Java escapes are decoded as TorchServe's Java
    parser decodes them. A repeated key keeps its last value.
    """
    result: dict[str, str] = {}
    for line in _logical_lines(text):
        # The key ends at the first unescaped '=', ':' or whitespace (java.util.Properties).
        i = 0
        while i < len(line) and line[i] not in "=: \t\f":
            i += 2 if line[i] == "\\" else 1
        key = line[:i]
        rest = line[i:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:]
        result[_unescape(key)] = _unescape(rest.strip())
    return result


def _read_properties(path: str, problems: list[str]) -> dict[str, str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        problems.append(f"config file {path!r} does not exist")
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"config file {path!r} cannot be read: {exc}")
        return {}
    return parse_properties(text)


_VARIABLE = re.compile(r"\$\$([^$]+[^$])\$\$")  # TorchServe's $$NAME$$ in a value


def _with_variables(key: str, value: str, environ: Mapping[str, str],
                    problems: list[str]) -> str | None:
    """``value`` with each ``$$NAME$$`` replaced by the environment variable NAME, as
    TorchServe reads config.properties (a secret kept out of the file, a port from the
    platform); None, and a problem, when one is not set (TorchServe refuses to start too)."""
    if "$$" not in value:
        return value
    missing = [name for name in _VARIABLE.findall(value) if name not in environ]
    for name in missing:
        problems.append(f"{key}: the environment variable {name} (in $${name}$$) is not set")
    return None if missing else _VARIABLE.sub(lambda m: environ[m.group(1)], value)


# config.properties keys TorchServe acts on that mservd does not, and what happens instead:
# each is named in a warning at start, so an operator does not believe it applied
TORCHSERVE_PROPERTIES_NOT_APPLIED = {
    "number_of_netty_threads": "TorchServe's Netty thread count: the HTTP frontends are "
                               "frontend_workers gunicorn workers, each one event loop",
    "netty_client_threads": "TorchServe's Netty thread count: the HTTP frontends are "
                            "frontend_workers gunicorn workers, each one event loop",
    "service_envelope": "requests are read by the route they come in on (KServe v1 and v2, "
                        "OpenAI) and the handler sees TorchServe's rows",
    "workflow_store": "workflows are not served",
    "default_service_handler": "an archive names its handler",
    "unregister_model_timeout": "an unregister answers at once; the version's workers "
                                "finish their batches and stop after it",
    "async_logging": "logs are written by each process as they come",
}


def load(
    config_file: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Resolve the server settings: defaults → config.properties → ``TS_<KEY>`` → overrides.

    Environment variables apply only when ``enable_envvars_config`` is true; the variable
    ``TS_ENABLE_ENVVARS_CONFIG``, when set, decides over the file (it is the higher layer).

    :param config_file: the config.properties to read; ``None`` reads none. A file named here
        that does not exist is an error.
    :param env: the environment to read ``TS_<KEY>`` from; ``os.environ`` when ``None``.
    :param overrides: values from command-line flags, by field name (``snapshot``) or key
        (``enable_snapshot``), typed or as strings; ``None`` values are skipped.
    :raises ConfigError: listing every bad value at once.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    keyed = _keyed_fields()
    by_key = {f.metadata["key"]: (f, convert) for f, convert in keyed}
    by_name = {f.name: (f, convert) for f, convert in keyed}
    values: dict[str, Any] = {}
    problems: list[str] = []

    def apply(f: dataclasses.Field[Any], convert: Convert, raw: Any, source: str,
              secret: bool = False) -> None:
        try:
            values[f.name] = convert(raw)
        except ValueError as exc:
            where = f.metadata["key"] + (f" (from {source})" if source else "")
            lines = exc.problems if isinstance(exc, _Problems) else [str(exc)]
            if secret:  # the message would show it
                lines = ["the value is not valid for this key"]
            problems.extend(f"{where}: {line}" for line in lines)

    path: str | None = None
    extra: dict[str, str] = {}
    if config_file is not None:
        path = os.fspath(config_file)
        for key, written in _read_properties(path, problems).items():
            raw = _with_variables(key, written, environ, problems)
            if raw is None:  # a variable it names is not set: reported
                continue
            if key in by_key:
                # a value from the environment may be a secret: a problem does not show it
                secret = raw != written
                apply(*by_key[key], raw, f"{written}, not shown" if secret else "", secret)
            else:
                extra[key] = raw
        for key in sorted(extra.keys() & TORCHSERVE_PROPERTIES_NOT_APPLIED.keys()):
            logger.warning("%s in %s is not applied by mservd: %s", key, path,
                           TORCHSERVE_PROPERTIES_NOT_APPLIED[key])
        if extra:
            logger.debug("Keys in %s that mservd does not use: %s", path, ", ".join(sorted(extra)))

    envvars_on = bool(values.get("enable_envvars_config", False))
    switch = environ.get("TS_ENABLE_ENVVARS_CONFIG")
    if switch is not None:
        try:
            envvars_on = to_bool(switch)
        except ValueError:
            pass  # reported below, with the other TS_ variables
    if envvars_on or switch is not None:
        for f, convert in keyed:
            var = "TS_" + f.metadata["key"].upper()
            if var in environ and (envvars_on or f.name == "enable_envvars_config"):
                apply(f, convert, environ[var], var)

    for name, raw in (overrides or {}).items():
        if raw is None:
            continue
        target = by_name.get(name) or by_key.get(name)
        if target is None:
            problems.append(f"{name}: not a setting (from command line)")
            continue
        apply(*target, raw, "command line")

    if "model_snapshot" in extra and "models" not in values:
        # KServe's TorchServe configs list their models in a TorchServe snapshot document
        try:
            models = _to_json_object(extra["model_snapshot"]).get("models")
            if not isinstance(models, Mapping):
                raise ValueError(f"its models must be an object, got {type(models).__name__}")
            values["models"] = _models_block(dict(models))
        except ValueError as exc:
            lines = exc.problems if isinstance(exc, _Problems) else [str(exc)]
            problems.extend(f"model_snapshot: {line}" for line in lines)

    if problems:
        raise ConfigError(problems)
    return Settings(**values, extra=types.MappingProxyType(extra), config_file=path)


# --- per-model settings -----------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSettings:
    """One model version's resolved settings. Build it with :func:`resolve_model_settings`."""

    min_workers: int
    max_workers: int
    batch_size: int
    max_batch_delay: int  # milliseconds
    response_timeout: int  # seconds
    startup_timeout: int  # seconds
    job_queue_size: int
    device_type: str | None  # "cpu", "gpu", or None: the daemon decides
    device_ids: tuple[int, ...]
    default_version: bool
    # model-config.yaml continuousBatching: a worker runs up to batch_size requests at once,
    # each joining and leaving between decoding steps (handlers/causal_lm.py)
    continuous_batching: bool = False
    # model-config.yaml batchSize: auto: the scheduler sizes batches and their delay from the
    # batching advisor's fit (mservd/advisor.py), starting at batch_size
    auto_batch: bool = False
    # model-config.yaml maxLatencyMs: the latency target the advisor sizes batches for
    max_latency_ms: int | None = None
    # model-config.yaml sequenceBatching (TorchServe's stateful inference, mservd/sequences.py):
    # each sequence's requests run in order on one worker, one at a time (with
    # continuous_batching: each joins between steps, the next while the one before streams);
    # at most max_num_sequence sequences open (at least batch_size x max_workers, as in
    # TorchServe), each queueing max_sequence_job_queue_size requests, closed after
    # sequence_max_idle_ms without a request (0, the default: not applied, as in TorchServe)
    # or sequence_timeout_ms after it opened (0: never)
    sequence_batching: bool = False
    max_num_sequence: int = 1
    max_sequence_job_queue_size: int = 1
    sequence_max_idle_ms: int = 0
    sequence_timeout_ms: int = 0

    @property
    def latency_target(self) -> float | None:
        """``max_latency_ms`` in seconds (None: no target)."""
        return self.max_latency_ms / 1000.0 if self.max_latency_ms else None


def _device_type(value: Any) -> str:
    if isinstance(value, str) and value.strip().lower() in ("cpu", "gpu"):
        return value.strip().lower()
    raise ValueError(f"{short_repr(value)} is not cpu or gpu")


def _device_ids(value: Any) -> tuple[int, ...]:
    items = [s for s in value.split(",") if s.strip()] if isinstance(value, str) else value
    bad = f"{short_repr(value)} is not a list of GPU ids"
    if isinstance(items, (list, tuple)):
        try:
            ids = tuple(to_int(item) for item in items)
        except ValueError:
            raise ValueError(bad) from None
        if any(i < 0 for i in ids):
            raise ValueError(f"{short_repr(value)} has a negative GPU id")
        return ids
    raise ValueError(bad)


_WORKERS = _chain(to_int, _at_least(0))
_BATCH = _chain(to_int, _at_least(1))
AUTO_BATCH_START = 8  # the batch size batchSize: auto starts from, before the advisor's fit


def _batch_size(value: Any) -> int | str:
    """A batch size, or ``auto``: sized by the batching advisor."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return _BATCH(value)


# camelCase key of model-config.yaml and the models= block → (ModelSettings field, converter)
_MODEL_YAML_KEYS: Mapping[str, tuple[str, Convert]] = types.MappingProxyType(
    {
        "minWorkers": ("min_workers", _WORKERS),
        "maxWorkers": ("max_workers", _WORKERS),
        "batchSize": ("batch_size", _batch_size),
        "maxBatchDelay": ("max_batch_delay", _chain(to_int, _at_least(0))),
        "responseTimeout": ("response_timeout", _chain(to_int, _above(0))),
        "startupTimeout": ("startup_timeout", _chain(to_int, _above(0))),
        "jobQueueSize": ("job_queue_size", _chain(to_int, _at_least(1))),
        "maxLatencyMs": ("max_latency_ms", _chain(to_int, _above(0))),
        "deviceType": ("device_type", _device_type),
        "deviceIds": ("device_ids", _device_ids),
        "continuousBatching": ("continuous_batching", to_bool),
        "sequenceBatching": ("sequence_batching", to_bool),
        "maxNumSequence": ("max_num_sequence", _chain(to_int, _at_least(1))),
        "maxSequenceJobQueueSize": ("max_sequence_job_queue_size", _chain(to_int, _at_least(1))),
        "sequenceMaxIdleMSec": ("sequence_max_idle_ms", _chain(to_int, _at_least(0))),
        "sequenceTimeoutMSec": ("sequence_timeout_ms", _chain(to_int, _at_least(0))),
    }
)
# model-config.yaml keys TorchServe acts on that mservd does not: said once per model version
# at its start, so a user does not believe them applied (the handler still sees them all)
TORCHSERVE_KEYS_NOT_APPLIED = {
    "parallelType": "model parallelism (torchrun, DeepSpeed, PiPPy) is not run",
    "parallelLevel": "model parallelism is not run",
    "torchrun": "model parallelism is not run",
    "useJobTicket": "requests queue up to jobQueueSize instead",
    "clientTimeoutInMills": "send X-Request-Timeout-Ms, or set default_request_timeout_ms",
    "maxRetryTimeoutInSec": "a worker that dies is started again at once",
    "asyncCommunication": "answers go back as each batch ends",
    "useVenv": "handlers run in the daemon's environment",
}
_MODELS_BLOCK_KEYS: Mapping[str, tuple[str, Convert]] = types.MappingProxyType(
    {**_MODEL_YAML_KEYS, "defaultVersion": ("default_version", to_bool)}
)
# the management API's query names (register and scale-workers calls)
_API_KEYS: Mapping[str, tuple[str, Convert]] = types.MappingProxyType(
    {
        "min_worker": ("min_workers", _WORKERS),
        "max_worker": ("max_workers", _WORKERS),
        "initial_workers": ("min_workers", _WORKERS),
        "batch_size": ("batch_size", _batch_size),
        "max_batch_delay": ("max_batch_delay", _chain(to_int, _at_least(0))),
        "response_timeout": ("response_timeout", _chain(to_int, _above(0))),
        "startup_timeout": ("startup_timeout", _chain(to_int, _above(0))),
    }
)


def _convert_layer(
    layer: Mapping[str, Any],
    keys: Mapping[str, tuple[str, Convert]],
    source: str,
    problems: list[str],
    origin: dict[str, str],
) -> dict[str, Any]:
    """The known keys of one layer, converted; unknown keys are someone else's (the handler's
    model_yaml_config, the API's url), and ``None`` means not given."""
    values: dict[str, Any] = {}
    for key, raw in layer.items():
        if key not in keys or raw is None:
            continue
        name, convert = keys[key]
        try:
            values[name] = convert(raw)
        except ValueError as exc:
            problems.append(f"{source} {key}: {exc}")
            continue
        origin[name] = f"{source} {key}"
    return values


def resolve_model_settings(
    settings: Settings,
    model_name: str,
    version: str,
    *,
    model_yaml: Mapping[str, Any] | None = None,
    api: Mapping[str, Any] | None = None,
    gpu_count: int = 0,
) -> ModelSettings:
    """One model version's settings: API call > model-config.yaml > ``models=`` block > defaults.

    :param model_yaml: the archive's model-config.yaml (:func:`read_model_yaml`); keys other
        than the worker settings are left to the handler.
    :param api: the management call's query parameters, strings or typed; other parameters
        (``url``, ``synchronous``) are ignored. ``initial_workers`` is the register call's name
        for ``min_worker``; as in TorchServe, a call that sets the minimum but no
        ``max_worker`` sets the maximum to the same number.
    :param gpu_count: the GPUs the daemon will use (after ``number_of_gpu``); with
        ``default_workers_per_model=0`` a model gets that many workers, at least 1.
    :raises ConfigError: listing every bad value, each named by source and key.
    """
    workers = settings.default_workers_per_model or max(1, gpu_count)
    values: dict[str, Any] = {
        "min_workers": workers,
        "max_workers": workers,
        "batch_size": settings.batch_size,
        "max_batch_delay": settings.max_batch_delay,
        "response_timeout": settings.default_response_timeout,
        "startup_timeout": settings.default_startup_timeout,
        "job_queue_size": settings.job_queue_size,
        "device_type": None,
        "device_ids": (),
        "default_version": False,
        "continuous_batching": False,
        "auto_batch": False,
        "max_latency_ms": None,
        "sequence_batching": False,
        "max_num_sequence": 1,
        "max_sequence_job_queue_size": 1,
        "sequence_max_idle_ms": 0,
        "sequence_timeout_ms": 0,
    }
    origin: dict[str, str] = {}
    problems: list[str] = []

    versions = settings.models.get(model_name)
    entry = versions.get(version) if isinstance(versions, Mapping) else None
    if isinstance(entry, Mapping):
        where = f"config.properties models[{model_name!r}][{version!r}]"
        values.update(_convert_layer(entry, _MODELS_BLOCK_KEYS, where, problems, origin))
    if model_yaml:
        yaml_values = _convert_layer(
            model_yaml, _MODEL_YAML_KEYS, "model-config.yaml", problems, origin
        )
        values.update(yaml_values)
        for key in sorted(TORCHSERVE_KEYS_NOT_APPLIED.keys() & model_yaml.keys()):
            logger.warning("model %s version %s: model-config.yaml's %s is TorchServe's and "
                           "not applied by mservd (%s)", model_name, version, key,
                           TORCHSERVE_KEYS_NOT_APPLIED[key])
    if api:
        given = {k: v for k, v in api.items() if v is not None}
        if "min_worker" in given:
            given.pop("initial_workers", None)  # the explicit name wins
        api_values = _convert_layer(given, _API_KEYS, "API", problems, origin)
        if "min_workers" in api_values and "max_worker" not in given:
            api_values["max_workers"] = api_values["min_workers"]
            origin["max_workers"] = origin["min_workers"]
        values.update(api_values)

    if not problems and values["max_workers"] < values["min_workers"]:
        # A bound nobody set follows the one that was set; two set bounds that cross are an error.
        if "max_workers" not in origin:
            values["max_workers"] = values["min_workers"]
        elif "min_workers" not in origin:
            values["min_workers"] = values["max_workers"]
        else:
            problems.append(
                f"max_worker ({values['max_workers']}) must be >= "
                f"min_worker ({values['min_workers']}) "
                f"(max from {origin['max_workers']}, min from {origin['min_workers']})"
            )
    cap = settings.max_workers_per_model
    for key in ("min_workers", "max_workers"):
        if not problems and values[key] > cap:
            problems.append(f"{key.replace('workers', 'worker')} ({values[key]}) is more than "
                            f"max_workers_per_model ({cap}) (from {origin.get(key, 'defaults')})")
    if problems:
        raise ConfigError(
            problems, title=f"Invalid settings for model {model_name!r} version {version!r}"
        )
    if values["batch_size"] == "auto":
        values["batch_size"], values["auto_batch"] = AUTO_BATCH_START, True
    if values["sequence_batching"] and values["sequence_max_idle_ms"] <= 0:
        # as in TorchServe, whose sequences exist only with an idle time: 0, its default, is
        # "not a stateful model" (a sequence closed once idle would move between workers)
        logger.warning("model %s version %s: sequenceBatching is not applied without "
                       "sequenceMaxIdleMSec (0: not a stateful model, as in TorchServe)",
                       model_name, version)
        values["sequence_batching"] = False
    if values["sequence_batching"]:  # as TorchServe counts it: at least a batch of sequences
        values["max_num_sequence"] = max(  # for every worker the model may run
            values["max_num_sequence"], values["batch_size"] * values["max_workers"])
    return ModelSettings(**values)


def read_model_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An archive's model-config.yaml as a dict (empty file → ``{}``).

    :raises ConfigError: the file cannot be read, is not YAML, is not a mapping, or is past
        ``MODEL_YAML_MAX_BYTES`` or ``MODEL_YAML_MAX_VALUES``.
    """
    name = os.fspath(path)
    title = "Invalid model-config.yaml"
    try:
        with open(name, encoding="utf-8") as stream:
            text = stream.read(MODEL_YAML_MAX_BYTES + 1)
        if len(text.encode()) > MODEL_YAML_MAX_BYTES:
            raise ConfigError([f"{name!r} is larger than {MODEL_YAML_MAX_BYTES} bytes"],
                              title=title)
        data = yaml.load(text, Loader=_SAFE_LOADER)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{name!r} cannot be read: {exc}"], title=title) from None
    except (yaml.YAMLError, RecursionError) as exc:  # nested past Python's stack too
        raise ConfigError([f"{name!r} is not valid YAML: {str(exc)[:300]}"],
                          title=title) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        problem = f"{name!r} must be a mapping of keys to values, got {kind}"
        raise ConfigError([problem], title=title)
    if _expands_past(data, MODEL_YAML_MAX_VALUES):
        problem = (f"{name!r} holds more than {MODEL_YAML_MAX_VALUES} values once its YAML "
                   "aliases are expanded")
        raise ConfigError([problem], title=title)
    return data


# A model-config.yaml travels to every worker as JSON, aliases expanded: a "billion laughs" of
# a few hundred bytes would be gigabytes there, so a file past this many values is refused.
MODEL_YAML_MAX_VALUES = 100_000
# TorchServe's are a few hundred bytes; a larger one is a handler's data, which belongs in the
# archive's extra files. Parsing takes about 0.25 s per MiB with libyaml, 2 s without.
MODEL_YAML_MAX_BYTES = 1 << 20
# libyaml's safe loader where PyYAML was built with it: the same documents, ten times faster
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _expands_past(data: Any, limit: int) -> bool:
    """Whether ``data`` has more than ``limit`` values, counting a shared value (a YAML alias)
    once per place it appears; stops counting at the limit."""
    pending, seen = [data], 0
    while pending:
        value = pending.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
    return False


METRIC_TYPES = ("counter", "gauge", "histogram")


def read_model_metrics(path: str) -> list[dict[str, Any]]:
    """The ``model_metrics`` of a TorchServe metrics.yaml, one ``{name, unit, dimensions,
    type}`` per metric (its ``ts_metrics``, the frontend's, are TorchServe's own and unused).

    :raises ValueError: the file cannot be read, or the section is not TorchServe's shape.
    """
    try:
        with open(path, encoding="utf-8") as stream:
            data = yaml.safe_load(stream) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise ValueError(f"{path!r} cannot be read as YAML: {str(exc)[:300]}") from None
    section = data.get("model_metrics") if isinstance(data, dict) else None
    if section is None:
        return []
    if not isinstance(section, dict):
        raise ValueError(f"{path!r}: model_metrics must map counter, gauge or histogram to "
                         "lists of metrics")
    declared = []
    for kind, metrics in section.items():
        if kind not in METRIC_TYPES or not isinstance(metrics, list):
            raise ValueError(f"{path!r}: model_metrics.{str(kind)[:60]} must be one of "
                             f"{', '.join(METRIC_TYPES)}, with a list of metrics")
        for metric in metrics:
            # names only, checked before anything is printed: YAML's aliases make a small
            # file a huge structure once written out
            names = (metric.get("dimensions") or []) if isinstance(metric, dict) else None
            if (not isinstance(metric, dict) or not isinstance(metric.get("name"), str)
                    or not isinstance(metric.get("unit", ""), str)
                    or not isinstance(names, list)
                    or not all(isinstance(n, str) for n in names)):
                raise ValueError(f"{path!r}: model_metrics.{kind} has {short_repr(metric)}; "
                                 "each metric is {name, unit, dimensions: [names]}, strings")
            declared.append({"name": metric["name"], "unit": metric.get("unit", ""),
                             "dimensions": list(names), "type": kind})
    return declared
