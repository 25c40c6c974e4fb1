"""The management verbs: register, scale, describe, list, unregister, set-default, ping, token.

Each verb runs inside the controller's loop and returns a ``Reply`` at once, or ``None`` after
arranging a later answer (a synchronous register waits for its workers; unpacking an archive
runs on the controller's helper thread). It changes state only through the registry and the
supervisor, and never blocks.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import archiver
from archiver import ArchiveError, UnpackLimits
from archiver.manifest import validate_model_name, validate_version
from mservd import protocol
from mservd.auth import INFERENCE
from mservd.config import ConfigError, read_model_yaml, resolve_model_settings, to_bool, to_int
from mservd.controller import model_folder, overview
from mservd.controller.model_folder import FolderError, is_model_folder
from mservd.controller.waiter import Waiter
from mservd.core.advisor import advise
from mservd.core.registry import ModelVersion
from mservd.errors import (
    BadRequest,
    Conflict,
    MethodNotAllowed,
    ModelNotFound,
    MservdError,
    ResourceNotFound,
)
from mservd.protocol import Reply

if TYPE_CHECKING:
    from mservd.auth import KeyStore
    from mservd.config import Settings
    from mservd.controller.supervisor import Supervisor
    from mservd.core.metrics import Metrics
    from mservd.core.registry import Registry
    from mservd.core.scheduler import Scheduler


class ModelService(Protocol):
    """What the management verbs may use of the controller, and nothing more."""

    settings: Settings
    registry: Registry
    supervisor: Supervisor
    keys: KeyStore | None
    metrics: Metrics
    scheduler: Scheduler
    started_at: float  # time.time() when the controller was made

    def submit(self, fn: Callable[..., Any], done: Callable[[Future], None],
               *args: Any) -> None: ...

    def wait_for(self, waiter: Waiter) -> None: ...

    def retire(self, mv: ModelVersion) -> None: ...

    def default_changed(self, name: str) -> None: ...

    def inference_key_changed(self) -> None: ...

    def reconcile_pools(self, now: float) -> None: ...

    def registry_changed(self) -> None: ...

    def healthy(self) -> bool: ...

    def ask_handler(self, mv: ModelVersion, frames: list[bytes],
                    answer: Callable[[protocol.Result], None]) -> None: ...

log = logging.getLogger(__name__)

Respond = Callable[[Reply], None]

DOWNLOAD_READ_TIMEOUT = 10.0  # seconds one read of a download may wait
DOWNLOAD_DEADLINE = 120.0  # seconds for a whole download


def _removing_on_failure(respond: Respond, fetched: list[Path]) -> Respond:
    """``respond``, removing the archives in ``fetched`` first if the answer is an error: a
    download that does not register leaves nothing in the model store."""
    def answer(reply: Reply) -> None:
        if reply.status >= 400:
            for path in fetched:
                path.unlink(missing_ok=True)
        respond(reply)
    return answer


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to an http(s) URL that allowed_urls allows, as the first was."""

    def __init__(self, check: Callable[[str], None]) -> None:
        self.check = check

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            raise BadRequest(f"URL {req.full_url!r} redirects to {newurl!r}: only http and "
                             "https are followed.")
        self.check(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _unpack_archive(path: Path, dest: Path,
                    limits: UnpackLimits) -> tuple[archiver.Manifest, dict[str, Any]]:
    """Unpack an archive and read its model-config.yaml: both off the controller's loop."""
    manifest = archiver.unpack(path, dest, limits)
    model_yaml = read_model_yaml(dest / manifest.config_file) if manifest.config_file else {}
    return manifest, model_yaml


def _iso_millis(when: float) -> str:
    """A UTC time as TorchServe writes a worker's start: ``2023-04-18T00:28:02.086Z``."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when))
    return f"{seconds}.{int(when * 1000) % 1000:03d}Z"


def _flag(value: Any, default: bool) -> bool:
    if value is None or value == "":
        return default
    try:
        return to_bool(value)
    except ValueError:
        raise BadRequest(f"Invalid boolean {value!r}: use true or false.") from None


def _int(args: dict[str, Any], key: str, default: int | None = None) -> int | None:
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


class Management:
    def __init__(self, controller: ModelService) -> None:
        self.ctl = controller
        self.settings = controller.settings
        self.store = Path(self.settings.model_store).resolve() if self.settings.model_store else None
        self.limits = UnpackLimits(max_bytes=self.settings.max_archive_bytes,
                                   max_files=self.settings.max_archive_files)

    def call(self, op: str, args: dict[str, Any], token: str | None, respond: Respond):
        verb = getattr(self, f"op_{op}", None)
        if verb is None:
            raise ResourceNotFound(f"Unknown management operation {op!r}.")
        if op in ("register", "unregister") and not self.settings.enable_model_api:
            raise MethodNotAllowed(
                "Model registration is disabled. Start mservd with --enable-model-api "
                "(or enable_model_api=true) to register and unregister models over the API.")
        if op == "token":
            return verb(args, token)
        return verb(args, respond)

    # -- register -----------------------------------------------------------------------

    def op_register(self, args: dict[str, Any], respond: Respond, *, startup: bool = False):
        url = args.get("url")
        if not url:
            raise BadRequest("Parameter url is required: the archive's file name in the model "
                             "store, e.g. url=resnet18.mar.")
        synchronous = _flag(args.get("synchronous"), True)
        api_args = {k: args.get(k) for k in ("batch_size", "max_batch_delay", "initial_workers",
                                              "response_timeout", "startup_timeout",
                                              "min_worker", "max_worker")}
        is_remote = urllib.parse.urlsplit(str(url)).scheme in ("http", "https")
        ctl = self.ctl
        fetched: list[Path] = []  # what this call downloaded into the store
        if is_remote:
            respond = _removing_on_failure(respond, fetched)

        def after_fetch(path: Path) -> None:
            # reading a .tar.gz's manifest decompresses it: off the loop, like unpacking
            ctl.submit(archiver.read_manifest, lambda f: after_manifest(f, path), path)

        def after_manifest(future: Future, path: Path) -> None:
            try:
                manifest = future.result()
                name = args.get("model_name") or manifest.model_name
                validate_model_name(name)
                version = manifest.model_version
                validate_version(version)
            except (ArchiveError, ValueError, OSError) as exc:
                respond(Reply.error(BadRequest(str(exc))))
                return
            key = (name, version)
            if ctl.registry.has_version(name, version) or key in ctl.loading:
                respond(Reply.error(Conflict(
                    f"Model version {version} is already registered for model {name}")))
                return
            ctl.loading.add(key)
            dest = ctl.run_dir / "models" / name / f"{version}-{uuid.uuid4().hex[:8]}"
            ctl.submit(_unpack_archive, lambda f: after_unpack(f, name, version, dest),
                       path, dest, self.limits)

        def after_unpack(future: Future, name: str, version: str, dest: Path) -> None:
            ctl.loading.discard((name, version))
            try:
                manifest, model_yaml = future.result()
            except (ArchiveError, ConfigError, OSError) as exc:
                shutil.rmtree(dest, ignore_errors=True)
                respond(Reply.error(BadRequest(str(exc))))
                return
            serve(name, version, dest, manifest.to_dict(), model_yaml, owned=True)

        def after_folder(future: Future) -> None:
            try:
                folder = future.result()
            except (FolderError, ConfigError, OSError) as exc:
                respond(Reply.error(BadRequest(str(exc))))
                return
            name, version = folder.name, folder.manifest["model"]["modelVersion"]
            if ctl.registry.has_version(name, version) or (name, version) in ctl.loading:
                respond(Reply.error(Conflict(
                    f"Model version {version} is already registered for model {name}")))
                return
            serve(name, version, folder.path, folder.manifest, folder.model_yaml, owned=False)

        def serve(name: str, version: str, model_dir: Path, doc: dict[str, Any],
                  model_yaml: dict[str, Any], owned: bool) -> None:
            """Add the version and start its workers; an unpacked copy goes if that fails."""
            def discard() -> None:
                if owned:
                    shutil.rmtree(model_dir, ignore_errors=True)

            try:
                settings = resolve_model_settings(self.settings, name, version,
                                                  model_yaml=model_yaml, api=api_args,
                                                  gpu_count=ctl.gpu_count)
                self.check_total_workers(settings.min_workers)
            except (ConfigError, BadRequest) as exc:
                discard()
                respond(Reply.error(exc if isinstance(exc, BadRequest) else BadRequest(str(exc))))
                return
            if args.get("handler"):
                doc["model"]["handler"] = args["handler"]
            if not doc["model"].get("handler"):
                discard()
                respond(Reply.error(BadRequest(
                    f"Archive {url!r} names no handler; pass handler=... or rebuild it with "
                    "model-archiver --handler.")))
                return
            doc["model"]["modelName"] = name
            mv = ModelVersion(name=name, version=version, url=str(url), model_dir=model_dir,
                              manifest=doc, settings=settings, model_yaml=model_yaml,
                              loaded_at_startup=startup, owns_model_dir=owned,
                              handler_override=args.get("handler") or None)
            ctl.registry.add(mv, make_default=settings.default_version)
            ctl.registry_changed()
            log.info("registered %s version %s from %s (%d workers, batch %d)", name, version,
                     url, mv.target_workers, settings.batch_size)
            ctl.reconcile_pools(time.monotonic())
            done = f'Model "{name}" Version: {version} registered with {mv.target_workers} ' \
                   "initial workers"
            if mv.target_workers == 0:  # TorchServe's words for it
                respond(Reply(200, {"status": f"{done}. Use scale workers API to add workers "
                                              "for the model."}))
                return
            if not synchronous:  # names the version, which `mservd models register` waits for
                respond(Reply(202, {"status": done}))
                return

            def check(now: float):
                if not ctl.registry.has_version(name, version):
                    mv.load_error = mv.load_error or "the model was unregistered while loading"
                    return self._failed_register(mv)
                if ctl.supervisor.is_failed(mv):
                    return self._failed_register(mv)
                if mv.live_count() >= mv.target_workers:
                    return Reply(200, {"status": done})
                return None

            def timed_out():
                mv.load_error = mv.load_error or (
                    f"Workers were not ready within startup_timeout ({settings.startup_timeout} s).")
                return self._failed_register(mv)

            ctl.wait_for(Waiter(respond, check, time.monotonic() + settings.startup_timeout + 5,
                                timed_out))

        if is_remote:
            self._check_allowed(str(url))

            def downloaded(path: Path) -> None:
                fetched.append(path)
                after_fetch(path)

            ctl.submit(self._download, lambda f: self._after(f, respond, downloaded), str(url))
            return None
        path = self._store_path(str(url), startup)
        if is_model_folder(path):
            ctl.submit(model_folder.read, after_folder, path, args.get("model_name"))
        else:
            after_fetch(path)
        return None

    def _after(self, future: Future, respond: Respond, then: Callable[[Path], None]) -> None:
        try:
            path = future.result()
        except MservdError as exc:
            respond(Reply.error(exc))
            return
        except Exception as exc:
            respond(Reply.error(BadRequest(f"Download failed: {type(exc).__name__}: {exc}")))
            return
        then(path)

    def _failed_register(self, mv: ModelVersion):
        error = mv.load_error or "the workers exited while loading"
        message = f"Failed to start workers for model {mv.name} version: {mv.version}"
        if self.ctl.registry.has_version(mv.name, mv.version):
            self.ctl.registry.remove(mv.name, mv.version)
            self.ctl.retire(mv)
            self.ctl.registry_changed()
        first = error.splitlines()[0] if error else ""
        body = {"code": 500, "type": "InternalServerException",
                "message": f"{message}: {first}", "traceback": error}
        return Reply(500, body)

    def _store_path(self, url: str, startup: bool = False) -> Path:
        """The archive or model folder ``url`` names inside the model store; at start-up (the
        operator's own --models) an absolute path may also name one anywhere."""
        if "\x00" in url:
            raise BadRequest(f"Invalid url {url!r}: it contains a NUL byte.")
        if url.startswith("file://"):
            url = urllib.parse.urlsplit(url).path
        if startup and Path(url).is_absolute():
            if not Path(url).exists():
                raise ModelNotFound(f"Model not found: {url}")
            return Path(url).resolve()
        if self.store is None:
            raise BadRequest("No model store is configured; start mservd with --model-store.")
        candidate = Path(url)
        if ".." in candidate.parts:
            raise BadRequest(f"Invalid url {url!r}: '..' is not allowed; name an archive "
                             "inside the model store.")
        path = (self.store / candidate).resolve()
        if not path.is_relative_to(self.store):
            raise BadRequest(f"Invalid url {url!r}: it points outside the model store "
                             f"{str(self.store)!r}.")
        if not path.exists():
            raise ModelNotFound(f"Model not found in model store: {url}")
        return path

    def _check_allowed(self, url: str) -> None:
        patterns = self.settings.allowed_urls
        if not any(re.fullmatch(p, url) for p in patterns):
            raise BadRequest(f"URL {url!r} is not allowed: it matches no allowed_urls pattern. "
                             "Add a pattern to allowed_urls in config.properties to allow it.")

    def _download(self, url: str) -> Path:
        """Fetch an allowed URL into the model store: http(s) only, every redirect checked
        against allowed_urls, a size cap, and one deadline for the whole download (it holds
        the controller's archive thread). Nothing is left in the store if it fails."""
        if self.store is None:
            raise BadRequest("No model store is configured to download into.")
        name = Path(urllib.parse.urlsplit(url).path).name
        if not name or name.startswith("."):
            raise BadRequest(f"URL {url!r} names no archive file.")
        target = self.store / name
        if target.exists():
            raise Conflict(f"Archive {name} already exists in the model store.")
        tmp = target.with_name(f".{name}.{uuid.uuid4().hex[:8]}.part")
        cap = self.settings.max_archive_bytes
        deadline = time.monotonic() + DOWNLOAD_DEADLINE
        opener = urllib.request.build_opener(_CheckedRedirects(self._check_allowed))
        try:
            with opener.open(url, timeout=DOWNLOAD_READ_TIMEOUT) as answer, \
                    open(tmp, "wb") as out:
                total = 0
                while chunk := answer.read1(1 << 20):
                    total += len(chunk)
                    if total > cap:
                        raise BadRequest(f"Download of {url!r} passed max_archive_bytes ({cap}).")
                    if time.monotonic() > deadline:
                        raise BadRequest(f"Download of {url!r} took longer than "
                                         f"{DOWNLOAD_DEADLINE:.0f} s.")
                    out.write(chunk)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(target)
        return target

    # -- scale, describe, list, unregister, default ---------------------------------------

    def check_total_workers(self, wanted: int, besides: ModelVersion | None = None) -> None:
        """400 unless ``wanted`` more workers (in place of ``besides``'s) fit in
        max_workers_total: a call must not fork workers past what the machine was sized for."""
        others = sum(mv.target_workers for mv in self.ctl.registry.all_versions()
                     if mv is not besides)
        cap = self.settings.max_workers_total
        if others + wanted > cap:
            raise BadRequest(f"{wanted} workers would make {others + wanted} in all, more than "
                             f"max_workers_total ({cap}); {others} are taken by other models.")

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
        self.check_total_workers(min_worker, besides=mv)
        synchronous = _flag(args.get("synchronous"), False)
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
        if _flag(args.get("customized"), False) and version != "all":
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
        if mv.settings.sequence_batching:  # TorchServe's stateful model
            out["stateful"] = True
            out["jobQueueStatus"]["openSequences"] = mv.batcher.open_count(time.monotonic())
        fit = mv.batch_costs.fit()
        if fit is not None:  # the batching advisor's (mservd models advise shows its curve)
            measured = mv.batch_costs.measured()
            out["batchCost"] = {
                **fit.to_dict(), "measured": [m.to_dict() for m in measured.values()],
                "advice": advise(fit, mv.settings.latency_target, mv.largest_batch(),
                                 measured).to_dict()}
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
        limit = _int(args, "limit", 100)
        start = _int(args, "next_page_token", 0)
        if limit <= 0 or start < 0:
            raise BadRequest("limit must be positive and next_page_token not negative.")
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
