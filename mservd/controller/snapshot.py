"""Snapshots of the model registry, so a restarted daemon serves what the last one served.

After each change to the registry the controller writes one JSON file under
``<log_dir>/config/`` (atomically: a crash, even SIGKILL, leaves the previous snapshot whole).
At start the newest snapshot that reads cleanly is turned back into register calls; a corrupt
or partial one is reported and skipped. This module only reads and writes files.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mservd.core.workflow_spec import node_model

if TYPE_CHECKING:
    from mservd.controller.workflows import WorkflowEntry
    from mservd.core.registry import Registry

log = logging.getLogger(__name__)

SUFFIX = "-snapshot.json"
KEEP = 10


def folder(log_dir: Path) -> Path:
    return log_dir / "config"


def capture(registry: Registry,
            workflows: dict[str, WorkflowEntry] | None = None) -> dict[str, Any]:
    """The registry as a snapshot document: what it takes to register it all again. A
    workflow's node models come back with their workflow (with their scale), not alone."""
    models: dict[str, Any] = {}
    for name in registry.names():
        versions = {}
        for mv in registry.versions(name):
            if mv.workflow is not None:
                continue
            # the handler only when the register call named one: otherwise the archive's own
            # (rebuilt since, it may name another) is what the restore must use
            versions[mv.version] = {"url": mv.url, "handler": mv.handler_override,
                                    **mv.settings_document()}
        if versions:
            models[name] = {"defaultVersion": registry.default_version(name),
                            "versions": versions}
            policy = registry.traffic(name)
            if policy is not None:  # applied again once its versions are back (Restore.traffic)
                models[name]["traffic"] = policy.document()
    flows = []
    for entry in (workflows or {}).values():
        nodes = {}
        for node in entry.spec.nodes.values():
            if node.model in registry:
                mv = registry.get(node.model)
                nodes[node.name] = {"minWorkers": mv.target_workers,
                                    "maxWorkers": mv.max_workers}
        flows.append({"name": entry.name, "url": entry.url,
                      "responseTimeout": entry.response_timeout, "nodes": nodes})
    return {"created": dt.datetime.now(dt.UTC).isoformat(), "models": models,
            "workflows": flows}


def write(log_dir: Path, document: dict[str, Any]) -> Path:
    target_dir = folder(log_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d%H%M%S%f")
    path = target_dir / f"{stamp}{SUFFIX}"
    tmp = target_dir / f".{stamp}.tmp"
    with open(tmp, "w") as handle:
        json.dump(document, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    for old in sorted(target_dir.glob(f"*{SUFFIX}"))[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


@dataclass(frozen=True)
class Restore:
    """Register calls to replay, the default version and traffic policy of each model, and
    what was skipped; and the workflows' register calls, each with its nodes' scales (model →
    (min, max))."""

    path: Path | None
    registrations: list[dict[str, Any]]
    defaults: dict[str, str]
    problems: list[str]
    traffic: dict[str, Any] = field(default_factory=dict)  # model -> its policy document
    workflows: list[WorkflowRestore] = field(default_factory=list)


@dataclass(frozen=True)
class WorkflowRestore:
    args: dict[str, Any]  # a register_workflow call's
    scales: dict[str, tuple[int, int]]  # node model -> (minWorkers, maxWorkers)


def load_latest(log_dir: Path) -> Restore:
    problems: list[str] = []
    for path in sorted(folder(log_dir).glob(f"*{SUFFIX}"), reverse=True):
        try:
            document = json.loads(path.read_text())
            registrations, defaults = _parse(document)
            traffic = {name: model["traffic"] for name, model in document["models"].items()
                       if isinstance(model.get("traffic"), dict)}
            workflows = _parse_workflows(document)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            message = f"snapshot {path.name} is unreadable ({type(exc).__name__}: {exc}); " \
                      "trying the one before it"
            log.error(message)
            problems.append(message)
            continue
        return Restore(path, registrations, defaults, problems, traffic, workflows)
    return Restore(None, [], {}, problems)


def _parse_workflows(document: dict[str, Any]) -> list[WorkflowRestore]:
    restores = []
    for flow in document.get("workflows") or []:
        name = str(flow["name"])
        scales = {node_model(name, node): (int(s["minWorkers"]), int(s["maxWorkers"]))
                  for node, s in flow["nodes"].items()}
        restores.append(WorkflowRestore(
            {"url": str(flow["url"]), "workflow_name": name,
             "response_timeout": float(flow["responseTimeout"])}, scales))
    return restores


def _parse(document: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    registrations = []
    defaults = {}
    for name, model in document["models"].items():
        if not isinstance(name, str) or not isinstance(model["versions"], dict):
            raise ValueError(f"model {name!r} is malformed")
        for entry in model["versions"].values():
            registrations.append({
                "url": str(entry["url"]),
                "model_name": name,
                "handler": entry.get("handler") or None,
                "min_worker": int(entry["minWorkers"]),
                "max_worker": int(entry["maxWorkers"]),
                "batch_size": _batch_size(entry["batchSize"]),
                "max_batch_delay": int(entry["maxBatchDelay"]),
                "response_timeout": int(entry["responseTimeout"]),
                "startup_timeout": int(entry["startupTimeout"]),
                "synchronous": "true",
            })
        if model.get("defaultVersion"):
            defaults[name] = str(model["defaultVersion"])
    return registrations, defaults


def _batch_size(value: Any) -> int | str:
    return "auto" if value == "auto" else int(value)
