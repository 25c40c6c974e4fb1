"""The workflow verbs: register a ``.war``, list, describe and unregister workflows; the table
of registered workflows (:class:`WorkflowEntry`), which the controller alone holds.

Registering unpacks the archive and reads its spec on the controller's helper thread, then
registers each node as a model version of its own, ``<workflow>__<node>``: a model node
through an ordinary :class:`~mservd.controller.registration.Registration` of its ``.mar`` from
the model store, a function node as a version whose handler is ``<handler file>:<function>``
in the unpacked ``.war``. Nodes register together; if one fails, those registered are
removed and the call answers TorchServe's 500. The node versions are then marked as the
workflow's, so only unregistering the workflow removes them.
"""

from __future__ import annotations

import ast
import logging
import shutil
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from archiver import ArchiveError, UnpackLimits
from archiver.war import WorkflowManifest, unpack_workflow
from mservd.controller.model_service import ModelService, Respond, check_total_workers
from mservd.controller.model_store import ModelStore
from mservd.controller.registration import Registration
from mservd.core.workflow_spec import FunctionNode, SpecError, WorkflowSpec, parse_spec
from mservd.errors import BadRequest, Conflict, MservdError, WorkflowNotFound
from mservd.protocol import Reply

if TYPE_CHECKING:
    from mservd.core.registry import ModelVersion

log = logging.getLogger(__name__)


@dataclass
class WorkflowEntry:
    """A registered workflow: where it came from, its graph and nodes, its unpacked folder."""

    name: str
    url: str
    spec: WorkflowSpec
    folder: Path
    response_timeout: float  # seconds one /wfpredict may take, the whole graph


def read_workflow(path: Path, dest: Path,
                  limits: UnpackLimits) -> tuple[WorkflowManifest, Any, set[str]]:
    """Unpack a ``.war`` and read its spec and its handler's top-level functions (by ``ast``,
    never importing user code in the controller): off the controller's loop."""
    manifest = unpack_workflow(path, dest, limits)
    try:
        spec = yaml.safe_load((dest / manifest.spec_file).read_text())
        tree = ast.parse((dest / manifest.handler).read_bytes(), manifest.handler)
    except (yaml.YAMLError, SyntaxError, ValueError, OSError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise ArchiveError(f"Invalid workflow specification: {exc}") from None
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    return manifest, spec, functions


class Workflows:
    """The registered workflows and their verbs."""

    def __init__(self, ctl: ModelService, models: ModelStore, limits: UnpackLimits) -> None:
        self.ctl = ctl
        self.models = models  # a model node's url names a .mar of the model store
        settings = ctl.settings
        self.store = ModelStore(settings.workflow_store or settings.model_store,
                                settings.allowed_urls, settings.max_archive_bytes, flat=True)
        self.limits = limits
        self.entries: dict[str, WorkflowEntry] = {}
        self.loading: set[str] = set()

    def get(self, name: str) -> WorkflowEntry:
        entry = self.entries.get(name)
        if entry is None:
            raise WorkflowNotFound(f"Workflow not found: {name}")
        return entry

    # -- register ------------------------------------------------------------------------

    def register(self, args: dict[str, Any], respond: Respond, startup: bool = False) -> None:
        url = args.get("url")
        if not url:
            raise BadRequest("Parameter url is required: the .war's file name in the workflow "
                             "store, e.g. url=my_workflow.war.")
        timeouts = {key: _positive(args, key, float(self.ctl.settings.default_response_timeout))
                    for key in ("response_timeout", "startup_timeout")}
        if str(url).startswith(("http://", "https://")):
            self.store.check_allowed(str(url))
            self.ctl.submit(self.store.download, lambda f: self._fetched(
                f, str(url), args, timeouts, respond, fetched=True), str(url))
            return
        path = self.store.path_of(str(url), startup)
        done: Future = Future()
        done.set_result(path)
        self._fetched(done, str(url), args, timeouts, respond, fetched=False)

    def _fetched(self, future: Future, url: str, args: dict[str, Any],
                 timeouts: dict[str, float], respond: Respond, fetched: bool) -> None:
        try:
            path = future.result()
        except MservdError as exc:
            respond(Reply.error(exc))
            return
        except Exception as exc:
            respond(Reply.error(BadRequest(f"Download failed: {type(exc).__name__}: {exc}")))
            return
        dest = self.ctl.run_dir / "workflows" / f"{path.stem}-{uuid.uuid4().hex[:8]}"

        def read(done: Future) -> None:
            if fetched:
                path.unlink(missing_ok=True)
            self._read(done, url, args, timeouts, dest, respond)

        self.ctl.submit(read_workflow, read, path, dest, self.limits)

    def _read(self, future: Future, url: str, args: dict[str, Any],
              timeouts: dict[str, float], dest: Path, respond: Respond) -> None:
        try:
            manifest, doc, functions = future.result()
            name = args.get("workflow_name") or manifest.name
            spec = parse_spec(name, doc, manifest.handler, functions)
        except (ArchiveError, SpecError, OSError) as exc:
            shutil.rmtree(dest, ignore_errors=True)
            respond(Reply.error(BadRequest(str(exc))))
            return
        try:
            if name in self.entries or name in self.loading:
                raise Conflict(f"Workflow {name} is already registered.")
            taken = [n.model for n in spec.nodes.values() if n.model in self.ctl.registry]
            if taken:
                raise Conflict(f"Workflow {name} cannot register: models {taken} are "
                               "registered already.")
            check_total_workers(self.ctl, sum(n.settings.max_workers
                                              for n in spec.nodes.values()))
        except MservdError as exc:
            shutil.rmtree(dest, ignore_errors=True)
            respond(Reply.error(exc))
            return
        entry = WorkflowEntry(name, url, spec, dest, timeouts["response_timeout"])
        self.loading.add(name)
        NodeRegistrations(self, entry, timeouts, respond).start()

    def registered(self, entry: WorkflowEntry, failures: list[str], respond: Respond) -> None:
        """Every node answered: the workflow is in, or what got in is taken out."""
        self.loading.discard(entry.name)
        nodes = node_versions(self.ctl, entry)
        if failures:
            for mv in nodes:
                self.ctl.registry.remove(mv.name, mv.version)
                self.ctl.retire(mv)
            shutil.rmtree(entry.folder, ignore_errors=True)
            self.ctl.registry_changed()
            log.error("workflow %s failed to register: %s", entry.name, failures)
            respond(Reply(500, {"code": 500, "type": "InternalServerException",
                                "message": f"Workflow {entry.name} has failed to register. "
                                           f"Failures: {failures}"}))
            return
        for mv in nodes:
            mv.workflow = entry.name
        self.entries[entry.name] = entry
        self.ctl.registry_changed()
        log.info("registered workflow %s from %s: nodes %s", entry.name, entry.url,
                 list(entry.spec.nodes))
        respond(Reply(200, {"status": f"Workflow {entry.name} has been registered and scaled "
                                      "successfully."}))

    # -- list, describe, unregister ----------------------------------------------------------

    def list(self, limit: int, start: int) -> Reply:
        names = sorted(self.entries)
        page = names[start:start + limit]
        body: dict[str, Any] = {"workflows": [
            {"workflowName": n, "workflowUrl": self.entries[n].url} for n in page]}
        if start + limit < len(names):
            body = {"nextPageToken": str(start + limit), **body}
        return Reply(200, body)

    def describe(self, name: str) -> Reply:
        entry = self.get(name)
        d = entry.spec.defaults
        return Reply(200, [{"workflowName": entry.name, "workflowUrl": entry.url,
                            "minWorkers": d.min_workers, "maxWorkers": d.max_workers,
                            "batchSize": d.batch_size, "maxBatchDelay": d.max_batch_delay,
                            "workflowDag": entry.spec.dag.describe()}])

    def unregister(self, name: str) -> Reply:
        entry = self.get(name)
        del self.entries[name]
        for node in entry.spec.nodes.values():
            if node.model in self.ctl.registry:
                for mv in self.ctl.registry.versions(node.model):
                    self.ctl.registry.remove(mv.name, mv.version, workflow=name)
                    self.ctl.retire(mv)
        self.ctl.submit(shutil.rmtree, lambda f: None, entry.folder, True)
        self.ctl.registry_changed()
        log.info("unregistered workflow %s", name)
        return Reply(200, {"status": f'Workflow "{name}" unregistered'})


class NodeRegistrations:
    """A workflow's nodes registering together: one answer per node, then one for the call."""

    def __init__(self, workflows: Workflows, entry: WorkflowEntry, timeouts: dict[str, float],
                 respond: Respond) -> None:
        self.workflows = workflows
        self.entry = entry
        self.timeouts = timeouts
        self.respond = respond
        self.waiting = len(entry.spec.nodes)
        self.failures: list[str] = []

    def start(self) -> None:
        ctl, entry = self.workflows.ctl, self.entry
        for node in entry.spec.nodes.values():
            s = node.settings
            # TorchServe's rule: a node runs max-workers workers (min = max), unless its .mar's
            # model-config.yaml sets minWorkers and maxWorkers
            args = {"url": node.url if not isinstance(node, FunctionNode) else entry.url,
                    "model_name": node.model, "batch_size": s.batch_size,
                    "max_batch_delay": s.max_batch_delay, "min_worker": s.max_workers,
                    "max_worker": s.max_workers, "synchronous": "true",
                    "response_timeout": int(self.timeouts["response_timeout"]),
                    "startup_timeout": int(self.timeouts["startup_timeout"])}
            registration = Registration(ctl, self.workflows.models, self.workflows.limits, args,
                                        self._answered(node.name), startup=False,
                                        archive_workers=True)
            try:
                if isinstance(node, FunctionNode):
                    doc = {"runtime": "python", "model": {
                        "modelName": node.model, "modelVersion": "1.0",
                        "handler": node.handler}}
                    registration.serve(node.model, "1.0", entry.folder, doc, {}, owned=False)
                else:
                    registration.start()
            except MservdError as exc:
                self._answered(node.name)(Reply.error(exc))

    def _answered(self, node: str) -> Respond:
        def respond(reply: Reply) -> None:
            if reply.status >= 400:
                body = reply.body if isinstance(reply.body, dict) else {}
                message = body.get("message") or reply.body_bytes().decode("utf-8", "replace")
                self.failures.append(f"{node}: {message}")
            self.waiting -= 1
            if self.waiting == 0:
                self.workflows.registered(self.entry, self.failures, self.respond)
        return respond


def _positive(args: dict[str, Any], key: str, default: float) -> float:
    value = args.get(key)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = 0.0
    if number <= 0:
        raise BadRequest(f"Parameter {key} must be a positive number of seconds, got "
                         f"{value!r}.")
    return number


def node_versions(ctl: ModelService, entry: WorkflowEntry) -> list[ModelVersion]:
    """The model versions of a workflow's nodes, in its dag's order."""
    return [ctl.registry.get(n.model) for n in entry.spec.nodes.values()
            if n.model in ctl.registry]
