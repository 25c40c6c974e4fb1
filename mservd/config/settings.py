"""The server's settings: one frozen :class:`Settings`, each field declaring its
``config.properties`` key and doc in its ``metadata`` (the only list of keys;
:func:`describe_settings` renders it for ``--help``)."""

from __future__ import annotations

import dataclasses
import json
import logging
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mservd.config.convert import (
    Convert,
    above,
    at_least,
    between,
    chain,
    converter_for,
    meta,
    one_of,
    valid_address,
    valid_port,
    valid_regex,
    valid_regex_list,
)
from mservd.config.model_keys import valid_models_block
from mservd.config.yaml_files import read_model_metrics

logger = logging.getLogger(__name__)


# --- checks of single keys ---------------------------------------------------------------


def valid_load_models(value: tuple[str, ...]) -> tuple[str, ...]:
    # TorchServe images ship "load_models=standalone"; it means nothing to load.
    if len(value) == 1 and value[0].lower() == "standalone":
        return ()
    return value


def valid_metrics_yaml(value: str) -> str:
    if value:
        read_model_metrics(value)  # a bad file stops the start, not the first get_metric
    return value


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
        metadata=meta(
            "inference_address",
            "Inference API address, http(s)://host:port (port 0 picks a free port).",
            valid_address,
        ),
    )
    management_address: str = field(
        default="http://127.0.0.1:8081",
        metadata=meta(
            "management_address",
            "Management API address, http(s)://host:port (port 0 picks a free port).",
            valid_address,
        ),
    )
    metrics_address: str = field(
        default="http://127.0.0.1:8082",
        metadata=meta(
            "metrics_address",
            "Metrics API address, http(s)://host:port (port 0 picks a free port).",
            valid_address,
        ),
    )
    grpc_inference_port: int = field(
        default=7070,
        metadata=meta("grpc_inference_port", "gRPC inference port on loopback.", valid_port),
    )
    grpc_management_port: int = field(
        default=7071,
        metadata=meta("grpc_management_port", "gRPC management port on loopback.", valid_port),
    )
    enable_metrics_api: bool = field(
        default=True,
        metadata=meta(
            "enable_metrics_api",
            "Serve the metrics API on metrics_address; false: no metrics port at all.",
        ),
    )
    cors_allowed_origin: str = field(
        default="",
        metadata=meta(
            "cors_allowed_origin",
            "Turns CORS on: every HTTP answer carries Access-Control-Allow-Origin with this "
            "value ('*' or an origin), and a browser's preflight (OPTIONS) is answered 200.",
        ),
    )
    cors_allowed_methods: str = field(
        default="",
        metadata=meta("cors_allowed_methods",
                       "Access-Control-Allow-Methods for CORS answers, e.g. GET, POST."),
    )
    cors_allowed_headers: str = field(
        default="",
        metadata=meta("cors_allowed_headers",
                       "Access-Control-Allow-Headers for CORS answers, e.g. Authorization."),
    )
    certificate_file: str = field(
        default="",
        metadata=meta(
            "certificate_file",
            "The X.509 certificate chain (PEM) the https:// addresses (and the gRPC ports "
            "with enable_grpc_ssl) serve.",
        ),
    )
    private_key_file: str = field(
        default="",
        metadata=meta("private_key_file", "The private key (PEM) of certificate_file."),
    )
    enable_grpc_ssl: bool = field(
        default=False,
        metadata=meta(
            "enable_grpc_ssl",
            "Serve the gRPC ports over TLS with certificate_file and private_key_file.",
        ),
    )
    model_store: str | None = field(
        default=None,
        metadata=meta("model_store", "Folder holding the model archives (.mar)."),
    )
    workflow_store: str | None = field(
        default=None,
        metadata=meta("workflow_store", "Folder holding the workflow archives (.war); empty "
                      "means model_store."),
    )
    load_workflows: tuple[str, ...] = field(
        default=(),
        metadata=meta(
            "load_workflows",
            "Workflow archives to load at start: 'all', 'a.war,b.war' or 'name=a.war' items, "
            "comma-separated; empty loads none.",
        ),
    )
    load_models: tuple[str, ...] = field(
        default=(),
        metadata=meta(
            "load_models",
            "Archives to load at start: 'all', 'a.mar,b.mar' or 'name=a.mar' items, "
            "comma-separated; empty or 'standalone' loads none.",
            valid_load_models,
        ),
    )
    default_workers_per_model: int = field(
        default=0,
        metadata=meta(
            "default_workers_per_model",
            "Workers per model when nothing else says; 0 means one per GPU, or 1 on CPU.",
            at_least(0),
        ),
    )
    job_queue_size: int = field(
        default=100,
        metadata=meta(
            "job_queue_size",
            "Requests a model may hold waiting for a worker before answering 503.",
            at_least(1),
        ),
    )
    default_response_timeout: int = field(
        default=120,
        metadata=meta(
            "default_response_timeout",
            "Seconds a worker may take on one batch before it is killed.",
            above(0),
        ),
    )
    default_startup_timeout: int = field(
        default=120,
        metadata=meta(
            "default_startup_timeout",
            "Seconds a worker may take to load its model.",
            above(0),
        ),
    )
    max_request_size: int = field(
        default=6553500,
        metadata=meta("max_request_size", "Largest request body in bytes (413 above).", above(0)),
    )
    max_response_size: int = field(
        default=6553500,
        metadata=meta("max_response_size", "Largest response body in bytes.", above(0)),
    )
    number_of_gpu: int | None = field(
        default=None,
        metadata=meta(
            "number_of_gpu",
            "Most GPUs to use; empty detects them all.",
            at_least(0),
        ),
    )
    batch_size: int = field(
        default=1,
        metadata=meta("batch_size", "Default largest batch per model.", at_least(1)),
    )
    max_batch_delay: int = field(
        default=100,
        metadata=meta(
            "max_batch_delay",
            "Default milliseconds a batch waits to fill before it is sent.",
            at_least(0),
        ),
    )
    enable_envvars_config: bool = field(
        default=False,
        metadata=meta(
            "enable_envvars_config",
            "Let TS_<KEY> environment variables override config.properties.",
        ),
    )
    enable_model_api: bool = field(
        default=False,
        metadata=meta(
            "enable_model_api",
            "Allow registering and unregistering models through the management API.",
        ),
    )
    disable_token_authorization: bool = field(
        default=False,
        metadata=meta(
            "disable_token_authorization",
            "Serve without bearer tokens (key_file.json is not written).",
        ),
    )
    token_expiration_min: float = field(
        default=60.0,
        metadata=meta(
            "token_expiration_min",
            "Minutes before inference and management keys expire.",
            above(0),
        ),
    )
    allowed_urls: tuple[str, ...] = field(
        default=(),
        metadata=meta(
            "allowed_urls",
            "Comma-separated regular expressions; a model URL must match one to be downloaded.",
            valid_regex_list,
        ),
    )
    decode_input_request: bool = field(
        default=True,
        metadata=meta(
            "decode_input_request",
            "Hand a handler JSON inputs parsed and text inputs as str (true), or every input "
            "as the bytes sent (false); TorchServe's /predictions inputs only.",
        ),
    )
    blacklist_env_vars: str = field(
        default="",
        metadata=meta(
            "blacklist_env_vars",
            "A regular expression: environment variables whose whole name matches it are "
            "hidden from the workers (and so from handler code); empty: none.",
            valid_regex,
        ),
    )
    metrics_mode: str = field(
        default="prometheus",
        metadata=meta(
            "metrics_mode",
            "Where metrics go: prometheus (the metrics API) or log.",
            one_of("prometheus", "log"),
        ),
    )
    metrics_config: str = field(
        default="",
        metadata=meta(
            "metrics_config",
            "A metrics.yaml in TorchServe's format: the metrics under its model_metrics are "
            "declared in every handler (context.metrics.get_metric finds them); empty: "
            "TorchServe's defaults, HandlerTime and PredictionTime.",
            valid_metrics_yaml,
        ),
    )
    install_py_dep_per_model: bool = field(
        default=False,
        metadata=meta(
            "install_py_dep_per_model",
            "pip-install an archive's requirements file when its model loads.",
        ),
    )
    log_dir: str = field(
        default="logs",
        metadata=meta("log_dir", "Folder for logs and config snapshots."),
    )
    snapshot: bool = field(
        default=True,
        metadata=meta(
            "enable_snapshot",
            "Write the model registry under <log_dir>/config/ and restore it at start "
            "(--ncs turns it off).",
        ),
    )
    frontend_workers: int = field(
        default=2,
        metadata=meta(
            "frontend_workers",
            "HTTP frontend worker processes under gunicorn's arbiter; each serves the "
            "inference, management and metrics ports.",
            at_least(1),
        ),
    )
    traffic_key_header: str = field(
        default="x-traffic-key",
        metadata=meta(
            "traffic_key_header",
            "The request header (HTTP) or metadata key (gRPC) whose value a model with a sticky "
            "traffic policy hashes onto its versions' weights: one key always sees one version "
            "(PUT /models/{m}/traffic).",
        ),
    )
    traffic_error_window_s: float = field(
        default=30.0,
        metadata=meta(
            "traffic_error_window_s",
            "Seconds of answers over which a version's 5xx rate is measured against its "
            "traffic policy's maxErrorRate.",
            above(0),
        ),
    )
    traffic_min_requests: int = field(
        default=20,
        metadata=meta(
            "traffic_min_requests",
            "Answers a version must have in the window before its 5xx rate can take its "
            "traffic away.",
            at_least(1),
        ),
    )
    traffic_cooldown_s: float = field(
        default=30.0,
        metadata=meta(
            "traffic_cooldown_s",
            "Seconds a version past its maxErrorRate gets no traffic; then it has its weight "
            "back (half-open), and failing again doubles this, up to 10 times.",
            above(0),
        ),
    )
    lend_idle_workers: bool = field(
        default=True,
        metadata=meta(
            "lend_idle_workers",
            "While a model version serves a lone client, lend its idle worker to that client's "
            "frontend, which then sends it requests past the controller (lower latency; "
            "docs/architecture.md). Such requests reach the counters within 10 ms of their "
            "answer, not on arrival; false sends every request through the controller's queue.",
        ),
    )
    frontend_connections: int = field(
        default=1000,
        metadata=meta(
            "frontend_connections",
            "Simultaneous connections each HTTP frontend worker keeps open on the inference "
            "port, and as many again on the management and metrics ports (counted apart, so a "
            "flood of one cannot lock out the other), and each gRPC port; past it a new "
            "connection is closed.",
            at_least(1),
        ),
    )
    max_workers_per_model: int = field(
        default=32,
        metadata=meta(
            "max_workers_per_model",
            "Most workers one model version may have (min_worker, max_worker, "
            "initial_workers, default_workers_per_model); 400 above.",
            at_least(1),
        ),
    )
    max_workers_total: int = field(
        default=128,
        metadata=meta(
            "max_workers_total",
            "Most workers all model versions may have together; a register or scale call "
            "that would pass it is 400.",
            at_least(1),
        ),
    )
    max_sequences_per_client: int = field(
        default=0,
        metadata=meta(
            "max_sequences_per_client",
            "Most sequences of one stateful model version (sequenceBatching) one client (its "
            "address: an IPv4 address, an IPv6 /64) may hold open; past it a new sequence is "
            "refused 503. 0: half of the version's maxNumSequence, rounded up, so that no "
            "one client fills it.",
            at_least(0),
        ),
    )
    frontend_keepalive: float = field(
        default=5.0,
        metadata=meta(
            "frontend_keepalive",
            "Seconds an HTTP connection may sit silent between requests (gunicorn's "
            "keepalive); the next request's headers must be whole by then.",
            above(0),
        ),
    )
    frontend_header_timeout: float = field(
        default=10.0,
        metadata=meta(
            "frontend_header_timeout",
            "Seconds a new HTTP connection has to send its first request's headers, else 408 "
            "and closed (slow clients cannot hold connections open); a gRPC connection has as "
            "long to send its HTTP/2 settings. A TLS handshake counts in it.",
            above(0),
        ),
    )
    frontend_body_timeout: float = field(
        default=60.0,
        metadata=meta(
            "frontend_body_timeout",
            "Seconds an HTTP request body may take from the end of its head, else 408 and "
            "closed.",
            above(0),
        ),
    )
    frontend_body_bytes: int = field(
        default=1 << 30,
        metadata=meta(
            "frontend_body_bytes",
            "Bytes of request bodies each HTTP frontend worker holds at once, counted from "
            "the first byte read until the answer is sent; a body that would pass it is "
            "refused 503 before more of it is read (a lone body is always taken).",
            at_least(1),
        ),
    )
    frontend_write_timeout: float = field(
        default=30.0,
        metadata=meta(
            "frontend_write_timeout",
            "Seconds an HTTP or gRPC streaming client may stop reading its answers before its "
            "connection (HTTP) or call (gRPC) is ended (answers are not buffered for it "
            "meanwhile).",
            above(0),
        ),
    )
    unknown_token_limit: int = field(
        default=8,
        metadata=meta(
            "unknown_token_limit",
            "Unknown bearer tokens one client address (IPv6: its /64) may have waiting for the "
            "controller's check at once, per frontend process; past it 503 with Retry-After, "
            "without asking the controller.",
            at_least(1),
        ),
    )
    frontend_timeout: float = field(
        default=30.0,
        metadata=meta(
            "frontend_timeout",
            "Seconds an HTTP frontend worker's event loop may stall before gunicorn replaces "
            "the worker (gunicorn's timeout); also the longest pause inside a request body.",
            above(0),
        ),
    )
    limit_request_line: int = field(
        default=8190,
        metadata=meta(
            "limit_request_line",
            "Longest HTTP request line in bytes (414 above), checked as it arrives; at most "
            "8190 (gunicorn's limit_request_line).",
            between(64, 8190),
        ),
    )
    limit_request_fields: int = field(
        default=100,
        metadata=meta(
            "limit_request_fields",
            "Most header fields in an HTTP request (431 above; gunicorn's "
            "limit_request_fields).",
            between(1, 32768),
        ),
    )
    limit_request_header_bytes: int = field(
        default=65536,
        metadata=meta(
            "limit_request_header_bytes",
            "Largest HTTP request head in bytes, request line and headers together (431 "
            "above), checked as it arrives.",
            between(1024, 1 << 24),
        ),
    )
    limit_request_field_size: int = field(
        default=8190,
        metadata=meta(
            "limit_request_field_size",
            "Longest HTTP header field in bytes, name and value (431 above), checked as it "
            "arrives (gunicorn's limit_request_field_size).",
            between(64, 65536),
        ),
    )
    shed_delay_ms: int = field(
        default=0,
        metadata=meta(
            "shed_delay_ms",
            "While an inference server process runs this many ms behind, new predictions get "
            "503 at once instead of waiting (0, the default, turns it off; 20 suits a server "
            "that must shed overload in milliseconds).",
            at_least(0),
        ),
    )
    max_archive_bytes: int = field(
        default=4 * 1024**3,
        metadata=meta("max_archive_bytes", "Largest unpacked archive in bytes.", above(0)),
    )
    max_archive_files: int = field(
        default=10000,
        metadata=meta("max_archive_files", "Most files an archive may hold.", above(0)),
    )
    max_queue_wait_ms: int = field(
        default=0,
        metadata=meta(
            "max_queue_wait_ms",
            "When the oldest request queued for a model has waited this many ms beyond its "
            "max_batch_delay (or four of the model's batch times, if longer), new requests for it "
            "are refused at once with 503 and Retry-After instead of queueing. Each HTTP frontend "
            "also keeps a fast model's predictions in flight to what it answers in this time, "
            "and to what it answers in a third of it once more arrive than it answers. 0, the "
            "default, turns both off: a request is then refused only when its model's queue is "
            "full or it cannot be answered within its deadline (or a model's maxLatencyMs).",
            at_least(0),
        ),
    )
    default_request_timeout_ms: int = field(
        default=0,
        metadata=meta(
            "default_request_timeout_ms",
            "Milliseconds a request may wait in a queue before it is answered 504 without being "
            "computed; 0 means the model's response timeout. A request can ask for less with "
            "the X-Request-Timeout-Ms header.",
            at_least(0),
        ),
    )
    drain_timeout: float = field(
        default=30.0,
        metadata=meta(
            "drain_timeout",
            "Seconds a stop waits for requests in flight before killing workers.",
            at_least(0),
        ),
    )
    log_level: str = field(
        default="INFO",
        metadata=meta(
            "log_level",
            "DEBUG, INFO, WARNING, ERROR or CRITICAL.",
            one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", upper=True),
        ),
    )
    log_format: str = field(
        default="plain",
        metadata=meta("log_format", "plain or json log lines.", one_of("plain", "json")),
    )
    log_max_bytes: int = field(
        default=100 * 1024 * 1024,
        metadata=meta(
            "log_max_bytes",
            "A log file past this size is copied to <name>.1 and emptied (0: never), as "
            "TorchServe's log4j2 rolls its logs at 100 MB.",
            at_least(0),
        ),
    )
    log_backup_count: int = field(
        default=5,
        metadata=meta(
            "log_backup_count",
            "Rotated copies kept of each log file (<name>.1 the newest).",
            at_least(0),
        ),
    )
    models: Mapping[str, Any] = field(
        default_factory=dict,
        metadata=meta(
            "models",
            'Per-model settings as JSON: {"name": {"version": {"defaultVersion": true, '
            '"marName": "name.mar", "minWorkers": 1, "maxWorkers": 1, "batchSize": 4, '
            '"maxBatchDelay": 100, "responseTimeout": 120}}}.',
            valid_models_block,
        ),
    )
    extra: Mapping[str, str] = field(default_factory=dict)
    config_file: str | None = None


def keyed_fields() -> list[tuple[dataclasses.Field[Any], Convert]]:
    """Settings fields that are config keys, each with its converter (type, then check)."""
    hints = typing.get_type_hints(Settings)
    result = []
    for f in dataclasses.fields(Settings):
        if "key" not in f.metadata:
            continue
        convert = converter_for(hints[f.name])
        check = f.metadata.get("check")
        result.append((f, chain(convert, check) if check else convert))
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
    for f, _ in keyed_fields():
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        rows.append((f.metadata["key"], _render(default), f.metadata["doc"]))
    return rows
