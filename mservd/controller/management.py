"""The management verbs: register, scale, describe, list, unregister, set-default, ping, token.

Each verb runs inside the controller's loop and returns a ``Reply`` at once, or ``None`` after
arranging a later answer (a synchronous register waits for its workers; unpacking an archive
runs on the controller's helper thread). It changes state only through the registry and the
supervisor, and never blocks.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from archiver import UnpackLimits
from mservd import protocol
from mservd.auth import INFERENCE
from mservd.config import to_int
from mservd.controller import overview
from mservd.controller.model_service import ModelService, Respond, check_total_workers
from mservd.controller.model_store import ModelStore
from mservd.controller.registration import Registration, flag
from mservd.controller.waiter import Waiter
from mservd.core.advisor import advise
from mservd.core.metrics import kv_cache_tokens
from mservd.core.registry import ModelVersion
from mservd.core.traffic import TrafficPolicy, version_state
from mservd.errors import BadRequest, MethodNotAllowed, MservdError, ResourceNotFound
from mservd.protocol import Reply

log = logging.getLogger(__name__)


def _iso_millis(when: float) -> str:
    """A UTC time as TorchServe writes a worker's start: ``2023-04-18T00:28:02.086Z``."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when))
    return f"{seconds}.{int(when * 1000) % 1000:03d}Z"


def _int(args: dict[str, Any], key: str, default: int) -> int:
    value = args.get(key)
    if value is None or value == "":
        return default
    try:
        return to_int(value)
    except ValueError:
        raise BadRequest(f"Parameter {key} must be an integer, got {value!r}.") from None


def _handler_metadata(reply: Reply) -> Any:
    """What a handler's ``describe_handle()`` returned, from its answer: JSON as the value it
    holds (a dict, or a string of JSON: TorchServe reads either into an object), other text
    as it is, None for nothing."""
    text = reply.body_bytes().decode("utf-8", "replace")
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


def _page(args: dict[str, Any]) -> tuple[int, int]:
    """A list call's page: (limit, start), TorchServe's limit and next_page_token."""
    limit = _int(args, "limit", 100)
    start = _int(args, "next_page_token", 0)
    if limit <= 0 or start < 0:
        raise BadRequest("limit must be positive and next_page_token not negative.")
    return limit, start


class Management:
    def __init__(self, controller: ModelService) -> None:
        self.ctl = controller
        self.settings = controller.settings
        self.store = ModelStore(self.settings.model_store, self.settings.allowed_urls,
                                self.settings.max_archive_bytes)
        self.limits = UnpackLimits(max_bytes=self.settings.max_archive_bytes,
                                   max_files=self.settings.max_archive_files)

    def call(self, op: str, args: dict[str, Any], token: str | None, respond: Respond):
        verb = getattr(self, f"op_{op}", None)
        if verb is None:
            raise ResourceNotFound(f"Unknown management operation {op!r}.")
        if op in ("register", "unregister", "register_workflow", "unregister_workflow") and (
                not self.settings.enable_model_api):
            raise MethodNotAllowed(
                "Model registration is disabled. Start mservd with --enable-model-api "
                "(or enable_model_api=true) to register and unregister models over the API.")
        if op == "token":
            return verb(args, token)
        return verb(args, respond)

    # -- register -----------------------------------------------------------------------

    def op_register(self, args: dict[str, Any], respond: Respond, *, startup: bool = False):
        Registration(self.ctl, self.store, self.limits, args, respond,
                     startup).start()  # answers through respond

    # -- workflows (controller/workflows.py) --------------------------------------------------

    def op_register_workflow(self, args: dict[str, Any], respond: Respond, *,
                             startup: bool = False):
        self.ctl.workflows.register(args, respond, startup)  # answers through respond

    def op_list_workflows(self, args: dict[str, Any], respond: Respond):
        limit, start = _page(args)
        return self.ctl.workflows.list(limit, start)

    def op_describe_workflow(self, args: dict[str, Any], respond: Respond):
        return self.ctl.workflows.describe(args["workflow"])

    def op_unregister_workflow(self, args: dict[str, Any], respond: Respond):
        return self.ctl.workflows.unregister(args["workflow"])

    # -- scale, describe, list, unregister, default ---------------------------------------

    def op_scale(self, args: dict[str, Any], respond: Respond):
        mv = self.ctl.registry.get(args["model"], args.get("version"))
        min_worker = _int(args, "min_worker", 1)
        max_worker = _int(args, "max_worker", max(min_worker, mv.max_workers))
        if min_worker < 0 or max_worker < 0:
            raise BadRequest("min_worker and max_worker must not be negative.")
        if max_worker < min_worker:
            raise BadRequest(f"max_worker ({max_worker}) must be >= min_worker ({min_worker}).")
        cap = self.settings.max_workers_per_model
        if max_worker > cap:
            raise BadRequest(f"max_worker ({max_worker}) is more than max_workers_per_model "
                             f"({cap}).")
        check_total_workers(self.ctl, min_worker, besides=mv)
        synchronous = flag(args.get("synchronous"), False)
        mv.target_workers = min_worker
        mv.max_workers = max_worker
        self.ctl.supervisor.forget(mv)  # a scale call retries a failed model
        self.ctl.reconcile_pools(time.monotonic())
        self.ctl.registry_changed()
        if not synchronous:
            return Reply(202, {"status": "Processing worker updates..."})

        def check(now: float):
            if not self.ctl.registry.has_version(mv.name, mv.version):
                return Reply(404, {"code": 404, "type": "ModelNotFoundException",
                                   "message": f"Model {mv.name} version {mv.version} was "
                                              "unregistered while scaling."})
            workers = list(mv.workers.values())
            if len(workers) == mv.target_workers and all(w.is_serving for w in workers):
                scaled = f"Workers scaled to {mv.target_workers} for model: {mv.name}"
                if args.get("version"):  # as TorchServe: named when the call named it
                    scaled += f", version: {mv.version}"
                return Reply(200, {"status": scaled})
            if self.ctl.supervisor.is_failed(mv):
                return Reply(500, {"code": 500, "type": "InternalServerException",
                                   "message": f"Failed to start workers for model {mv.name} "
                                              f"version: {mv.version}: {mv.load_error}"})
            return None

        def timed_out():
            return Reply(500, {"code": 500, "type": "InternalServerException",
                               "message": f"Workers for model {mv.name} were not scaled to "
                                          f"{mv.target_workers} within startup_timeout."})

        self.ctl.wait_for(Waiter(respond, check,
                                 time.monotonic() + mv.settings.startup_timeout + 5, timed_out))
        return None

    def op_describe(self, args: dict[str, Any], respond: Respond):
        name, version = args["model"], args.get("version")
        registry = self.ctl.registry
        if version == "all":
            versions = registry.versions(name)
        else:
            versions = [registry.get(name, version)]
        if flag(args.get("customized"), False) and version != "all":
            return self._describe_customized(versions[0], respond)
        return Reply(200, [self.describe(mv) for mv in versions])

    def _describe_customized(self, mv: ModelVersion, respond: Respond) -> None:
        """``customized=true``: the describe document with the handler's own metadata (its
        ``describe_handle()``) as ``customizedMetadata``, asked of a worker like a request,
        as TorchServe does. A handler that fails answers with its error."""
        if mv.settings.continuous_batching:
            raise BadRequest(f"Model {mv.name} version {mv.version} batches continuously: its "
                             "handler runs sequences, not a describe call; describe it without "
                             "customized=true.")

        def answered(result: protocol.Result) -> None:
            reply = Reply.from_result(result)
            if reply.status >= 400:
                respond(reply)
                return
            doc = self.describe(mv)
            metadata = _handler_metadata(reply)
            if metadata is not None:
                doc["customizedMetadata"] = metadata
            respond(Reply(200, [doc]))

        self.ctl.ask_handler(mv, protocol.describe_question(), answered)

    def describe(self, mv: ModelVersion) -> dict[str, Any]:
        workers = []
        for worker in sorted(mv.workers.values(), key=lambda w: int(w.id)):
            workers.append({
                "id": worker.id,
                "startTime": _iso_millis(worker.started),
                "status": worker.status,
                "memoryUsage": worker.memory_bytes(),
                "pid": worker.pid,
                "gpu": worker.gpu_id is not None,
                "gpuUsage": worker.gpu_usage(),
            })
        out = {
            "modelName": mv.name,
            "modelVersion": mv.version,
            "modelUrl": mv.url,
            "runtime": mv.manifest.get("runtime", "python"),
            **mv.settings_document(),
            "loadedAtStartup": mv.loaded_at_startup,
            "isDefault": self.ctl.registry.default_version(mv.name) == mv.version,
            "workers": workers,
            "jobQueueStatus": {"remainingCapacity": mv.batcher.remaining_capacity,
                               "pendingRequests": len(mv.batcher)},
        }
        kv = kv_cache_tokens(mv)
        if kv is not None:  # a generation handler's KV cache, summed over its live workers
            out["kvCache"] = {"capacityTokens": kv[1], "usedTokens": kv[0],
                              "usageRatio": round(kv[0] / kv[1], 4),
                              "prefixHitTokens": self.ctl.metrics.version(mv.key).prefix_hit_count}
        if mv.settings.sequence_batching:  # TorchServe's stateful model
            out["stateful"] = True
            out["jobQueueStatus"]["openSequences"] = mv.sequences.open_count(time.monotonic())
        fit = mv.batch_costs.fit()
        if fit is not None:  # the batching advisor's (mservd models advise shows its curve)
            measured = mv.batch_costs.measured()
            out["batchCost"] = {
                **fit.to_dict(), "measured": [m.to_dict() for m in measured.values()],
                "advice": advise(fit, mv.settings.latency_target, mv.largest_batch(),
                                 measured).to_dict()}
        policy = self.ctl.registry.traffic(mv.name)
        if policy is not None and mv.version in policy.versions():
            out["traffic"] = self.traffic_state(mv, policy)
        if mv.workflow is not None:  # a node of a workflow: only unregistering it removes this
            out["workflowName"] = mv.workflow
        if mv.load_error:
            out["loadError"] = mv.load_error
        return out

    def op_overview(self, args: dict[str, Any], respond: Respond):
        """What the dashboard draws (mservd/controller/overview.py), on one line: each document is one
        server-sent event."""
        ctl = self.ctl
        document = overview.document(ctl.registry, ctl.scheduler, ctl.supervisor, ctl.metrics,
                                     ctl.started_at, time.monotonic())
        return Reply(200, json.dumps(document, separators=(",", ":")).encode())

    def op_list(self, args: dict[str, Any], respond: Respond):
        limit, start = _page(args)
        names = self.ctl.registry.names()
        page = names[start:start + limit]
        body: dict[str, Any] = {"models": [
            {"modelName": n, "modelUrl": self.ctl.registry.get(n).url} for n in page]}
        if start + limit < len(names):
            body = {"nextPageToken": str(start + limit), **body}
        return Reply(200, body)

    def op_unregister(self, args: dict[str, Any], respond: Respond):
        name = args["model"]
        mv = self.ctl.registry.remove(name, args.get("version"))
        self.ctl.retire(mv)
        self.ctl.registry_changed()
        log.info("unregistered %s version %s", mv.name, mv.version)
        return Reply(200, {"status": f'Model "{name}" unregistered'})

    def op_set_default(self, args: dict[str, Any], respond: Respond):
        name, version = args["model"], args["version"]
        self.ctl.registry.set_default(name, version)
        self.ctl.default_changed(name)
        self.ctl.registry_changed()
        return Reply(200, {"status": f'Default version successfully updated for model "{name}" '
                                     f'to "{version}"'})

    # -- versions that share traffic (core/traffic.py) ------------------------------------

    def op_set_traffic(self, args: dict[str, Any], respond: Respond):
        """``PUT /models/{m}/traffic``: the model's unversioned requests are shared among its
        versions as the document says, from now on."""
        name = args["model"]
        versions = self.ctl.registry.versions(name)
        text = args.get("traffic")
        try:
            document = json.loads(text) if isinstance(text, str) else None
        except ValueError as exc:
            raise BadRequest(f"The traffic document is not JSON: {exc}. Send e.g. "
                             '{"1.0": 90, "2.0": 10}.') from None
        policy = TrafficPolicy.parse(name, document, [mv.version for mv in versions],
                                     any(mv.settings.sequence_batching for mv in versions))
        self._traffic_changed(name, policy)
        log.info("traffic of model %s set: %s", name, policy.summary())
        return Reply(200, {"status": f'Traffic of model "{name}" set: {policy.summary()}'})

    def op_describe_traffic(self, args: dict[str, Any], respond: Respond):
        """``GET /models/{m}/traffic``: the policy, and how each version stands under it."""
        name = args["model"]
        registry = self.ctl.registry
        versions = registry.versions(name)
        policy = registry.traffic(name)
        default = registry.default_version(name)
        shown = policy or TrafficPolicy({default: 100.0} if default else {})
        return Reply(200, {"modelName": name, "policy": policy is not None,
                           **shown.document(),
                           "versions": [{"modelVersion": mv.version,
                                         **self.traffic_state(mv, shown)} for mv in versions]})

    def op_clear_traffic(self, args: dict[str, Any], respond: Respond):
        """``DELETE /models/{m}/traffic``: only the default version serves again."""
        name = args["model"]
        self.ctl.registry.versions(name)  # 404 for an unknown model
        self._traffic_changed(name, None)
        log.info("traffic policy of model %s removed", name)
        return Reply(200, {"status": f'Traffic of model "{name}" removed: its default version '
                                     f"{self.ctl.registry.default_version(name)} serves every "
                                     "unversioned request"})

    def restore_traffic(self, documents: dict[str, Any]) -> list[str]:
        """At start: each model's policy (a snapshot's or the ``models=`` block's), once its
        versions are loaded; what could not be applied, as warnings."""
        problems = []
        for name, document in documents.items():
            try:
                self.op_set_traffic({"model": name, "traffic": json.dumps(document)},
                                    lambda reply: None)
            except MservdError as exc:
                problems.append(f"the traffic policy of model {name} was not applied: "
                                f"{exc.message}")
                log.error(problems[-1])
        return problems

    def _traffic_changed(self, name: str, policy: TrafficPolicy | None) -> None:
        self.ctl.registry.set_traffic(name, policy)
        self.ctl.scheduler.traffic.forget(name)  # breakers start afresh under a new policy
        self.ctl.default_changed(name)  # no lease may take its unversioned requests now
        self.ctl.registry_changed()

    def traffic_state(self, mv: ModelVersion, policy: TrafficPolicy) -> dict[str, Any]:
        return version_state(mv.version, mv.live_count(), policy,
                             self.ctl.scheduler.traffic.health.get(mv.key), time.monotonic())

    def op_authorize(self, args: dict[str, Any], respond: Respond):
        """Nothing but the key check the controller makes before every verb (VERB_KEYS): a
        frontend asks it before it reads a stranger's request body, the dashboard before it
        serves its page."""
        return Reply(200, {"status": "Authorized"})

    def op_ping(self, args: dict[str, Any], respond: Respond):
        if self.ctl.healthy():
            return Reply(200, {"status": "Healthy"})
        return Reply(500, {"status": "Unhealthy"})

    def op_token(self, args: dict[str, Any], token: str | None):
        if self.ctl.keys is None:
            raise BadRequest("Token authorization is disabled; there are no keys to rotate.")
        kind = args.get("type") or ""
        key = self.ctl.keys.rotate(token, kind)
        if kind == INFERENCE:
            self.ctl.inference_key_changed()
        return Reply(200, {"type": kind, "key": key})

    def op_metrics(self, args: dict[str, Any], respond: Respond):
        from mservd.core.metrics import CONTENT_TYPE

        names = args.get("names") or []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest("names must be a list of metric names.")
        return Reply(200, self.ctl.metrics.render(
            self.ctl.registry, self.ctl.scheduler.running_requests, names),
            content_type=CONTENT_TYPE)

    # -- Open Inference Protocol v2: readiness and metadata (docs/v2.md) -------------------

    def op_v2_model_ready(self, args: dict[str, Any], respond: Respond):
        """Whether a model version has a live worker; 404 when it is not registered."""
        mv = self.ctl.registry.get(args["model"], args.get("version") or None)
        return Reply(200, {"name": mv.name, "version": mv.version,
                           "ready": mv.live_count() > 0})

    def op_v2_model_metadata(self, args: dict[str, Any], respond: Respond):
        """Name, versions, platform and declared tensors (model-config.yaml ``v2:``)."""
        from mservd.v2.codec import V2Error
        from mservd.v2.metadata import from_model_yaml

        mv = self.ctl.registry.get(args["model"], args.get("version") or None)
        try:
            meta = from_model_yaml(mv.model_yaml)
        except V2Error as exc:
            raise BadRequest(f"Model {mv.name} version {mv.version}: {exc}") from None
        return Reply(200, {
            "name": mv.name,
            "versions": [v.version for v in self.ctl.registry.versions(mv.name)],
            "platform": meta.platform,
            "inputs": [spec.to_dict() for spec in meta.inputs],
            "outputs": [spec.to_dict() for spec in meta.outputs],
        })
