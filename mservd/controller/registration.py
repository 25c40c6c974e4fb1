"""One register call, step by step: fetch the archive (a path in the model store, or a URL
downloaded into it), read its manifest, unpack it (or read a model folder), resolve its
settings, add the version and start its workers, and answer at once or once they are ready.

Each slow step (a download, reading a compressed manifest, unpacking) runs on the controller's
helper thread and calls the next step back on the controller's loop, so the loop never blocks;
a :class:`Registration` holds what the steps share.
"""

from __future__ import annotations

import logging
import shutil
import time
import urllib.parse
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import archiver
from archiver import ArchiveError, UnpackLimits
from archiver.manifest import validate_model_name, validate_version
from mservd.config import ConfigError, read_model_yaml, resolve_model_settings, to_bool
from mservd.controller import model_folder
from mservd.controller.model_folder import FolderError, is_model_folder
from mservd.controller.model_service import ModelService, Respond, check_total_workers
from mservd.controller.waiter import Waiter
from mservd.core.registry import ModelVersion
from mservd.errors import BadRequest, Conflict, MservdError
from mservd.protocol import Reply

if TYPE_CHECKING:
    from mservd.controller.model_store import ModelStore

log = logging.getLogger(__name__)
API_KEYS = ("batch_size", "max_batch_delay", "initial_workers", "response_timeout",
            "startup_timeout", "min_worker", "max_worker")  # the call's model settings


def flag(value: Any, default: bool) -> bool:
    if value is None or value == "":
        return default
    try:
        return to_bool(value)
    except ValueError:
        raise BadRequest(f"Invalid boolean {value!r}: use true or false.") from None


def unpack_archive(path: Path, dest: Path,
                   limits: UnpackLimits) -> tuple[archiver.Manifest, dict[str, Any]]:
    """Unpack an archive and read its model-config.yaml: both off the controller's loop."""
    manifest = archiver.unpack(path, dest, limits)
    model_yaml = read_model_yaml(dest / manifest.config_file) if manifest.config_file else {}
    return manifest, model_yaml


def archive_workers_first(api: dict[str, Any], model_yaml: dict[str, Any]) -> dict[str, Any]:
    """A workflow node's call settings, less its worker counts when its archive's
    model-config.yaml sets its own (minWorkers and maxWorkers, 0 < min <= max): TorchServe
    registers a node with the spec's max-workers unless the .mar says so (``handleRegister``)."""
    try:
        low, high = int(model_yaml["minWorkers"]), int(model_yaml["maxWorkers"])
    except (KeyError, TypeError, ValueError):
        return api
    if not 0 < low <= high:
        return api
    return {**api, "min_worker": None, "max_worker": None, "initial_workers": None}


class Registration:
    """A register call from its arguments to its answer (``respond``, called once)."""

    def __init__(self, ctl: ModelService, store: ModelStore, limits: UnpackLimits,
                 args: dict[str, Any], respond: Respond, startup: bool,
                 archive_workers: bool = False) -> None:
        self.ctl = ctl
        self.store = store
        self.limits = limits
        self.args = args
        self.startup = startup  # the operator's own --models: absolute paths allowed
        self.url = args.get("url")
        if not self.url:
            raise BadRequest("Parameter url is required: the archive's file name in the model "
                             "store, e.g. url=resnet18.mar.")
        self.synchronous = flag(args.get("synchronous"), True)
        self.api_args = {k: args.get(k) for k in API_KEYS}
        self.archive_workers = archive_workers  # a workflow node: its .mar's worker counts win
        self.remote = urllib.parse.urlsplit(str(self.url)).scheme in ("http", "https")
        self.fetched: list[Path] = []  # what this call downloaded into the store
        self._respond = respond

    def respond(self, reply: Reply) -> None:
        """Answer the call; a download that does not register leaves nothing in the store."""
        if reply.status >= 400:
            for path in self.fetched:
                path.unlink(missing_ok=True)
        self._respond(reply)

    def start(self) -> None:
        store = self.store
        if self.remote:
            store.check_allowed(str(self.url))
            self.ctl.submit(store.download, self.downloaded, str(self.url))
            return
        path = store.path_of(str(self.url), self.startup)
        if is_model_folder(path):
            self.ctl.submit(model_folder.read, self.folder_read, path, self.args.get("model_name"))
        else:
            self.fetched_archive(path)

    def downloaded(self, future: Future) -> None:
        try:
            path = future.result()
        except MservdError as exc:
            self.respond(Reply.error(exc))
            return
        except Exception as exc:
            self.respond(Reply.error(BadRequest(f"Download failed: {type(exc).__name__}: {exc}")))
            return
        self.fetched.append(path)
        self.fetched_archive(path)

    def fetched_archive(self, path: Path) -> None:
        # reading a .tar.gz's manifest decompresses it: off the loop, like unpacking
        self.ctl.submit(archiver.read_manifest, lambda f: self.manifest_read(f, path), path)

    def manifest_read(self, future: Future, path: Path) -> None:
        try:
            manifest = future.result()
            name = self.args.get("model_name") or manifest.model_name
            validate_model_name(name)
            version = manifest.model_version
            validate_version(version)
        except (ArchiveError, ValueError, OSError) as exc:
            self.respond(Reply.error(BadRequest(str(exc))))
            return
        if self.taken(name, version):
            return
        self.ctl.loading.add((name, version))
        dest = self.ctl.run_dir / "models" / name / f"{version}-{uuid.uuid4().hex[:8]}"
        self.ctl.submit(unpack_archive, lambda f: self.unpacked(f, name, version, dest),
                        path, dest, self.limits)

    def unpacked(self, future: Future, name: str, version: str, dest: Path) -> None:
        self.ctl.loading.discard((name, version))
        try:
            manifest, model_yaml = future.result()
        except (ArchiveError, ConfigError, OSError) as exc:
            shutil.rmtree(dest, ignore_errors=True)
            self.respond(Reply.error(BadRequest(str(exc))))
            return
        self.serve(name, version, dest, manifest.to_dict(), model_yaml, owned=True)

    def folder_read(self, future: Future) -> None:
        try:
            folder = future.result()
        except (FolderError, ConfigError, OSError) as exc:
            self.respond(Reply.error(BadRequest(str(exc))))
            return
        name, version = folder.name, folder.manifest["model"]["modelVersion"]
        if self.taken(name, version):
            return
        self.serve(name, version, folder.path, folder.manifest, folder.model_yaml, owned=False)

    def taken(self, name: str, version: str) -> bool:
        """Answer 409 if the version is registered or loading already (400 for a version
        named ``traffic``: /models/{m}/traffic is the model's traffic policy)."""
        if version == "traffic":
            self.respond(Reply.error(BadRequest(
                f"Model {name} cannot have a version named 'traffic': /models/{name}/traffic "
                "is its traffic policy. Archive it with another --version.")))
            return True
        if self.ctl.registry.has_version(name, version) or (name, version) in self.ctl.loading:
            self.respond(Reply.error(Conflict(
                f"Model version {version} is already registered for model {name}")))
            return True
        return False

    def serve(self, name: str, version: str, model_dir: Path, doc: dict[str, Any],
              model_yaml: dict[str, Any], owned: bool) -> None:
        """Add the version and start its workers; an unpacked copy goes if that fails."""
        ctl, url = self.ctl, self.url
        try:
            api = archive_workers_first(self.api_args, model_yaml) if self.archive_workers \
                else self.api_args
            settings = resolve_model_settings(ctl.settings, name, version,
                                              model_yaml=model_yaml, api=api,
                                              gpu_count=ctl.gpu_count)
            check_total_workers(ctl, settings.min_workers)
            handler = self.args.get("handler") or doc["model"].get("handler")
            if not handler:
                raise BadRequest(f"Archive {url!r} names no handler; pass handler=... or "
                                 "rebuild it with model-archiver --handler.")
        except (ConfigError, BadRequest) as exc:
            if owned:
                shutil.rmtree(model_dir, ignore_errors=True)
            self.respond(Reply.error(exc if isinstance(exc, BadRequest) else BadRequest(str(exc))))
            return
        doc["model"]["handler"] = handler
        doc["model"]["modelName"] = name
        mv = ModelVersion(name=name, version=version, url=str(url), model_dir=model_dir,
                          manifest=doc, settings=settings, model_yaml=model_yaml,
                          loaded_at_startup=self.startup, owns_model_dir=owned,
                          handler_override=self.args.get("handler") or None)
        ctl.registry.add(mv, make_default=settings.default_version)
        ctl.registry_changed()
        log.info("registered %s version %s from %s (%d workers, batch %d)", name, version,
                 url, mv.target_workers, settings.batch_size)
        ctl.reconcile_pools(time.monotonic())
        done = f'Model "{name}" Version: {version} registered with {mv.target_workers} ' \
               "initial workers"
        if mv.target_workers == 0:  # TorchServe's words for it
            self.respond(Reply(200, {"status": f"{done}. Use scale workers API to add workers "
                                               "for the model."}))
        elif not self.synchronous:  # names the version, which `models register` waits for
            self.respond(Reply(202, {"status": done}))
        else:
            self.wait_for_workers(mv, done)

    def wait_for_workers(self, mv: ModelVersion, done: str) -> None:
        """Answer a synchronous call once its workers are ready, or failed, or late."""
        ctl, timeout = self.ctl, mv.settings.startup_timeout

        def check(now: float) -> Reply | None:
            if not ctl.registry.has_version(mv.name, mv.version):
                mv.load_error = mv.load_error or "the model was unregistered while loading"
                return self.failed(mv)
            if ctl.supervisor.is_failed(mv):
                return self.failed(mv)
            if mv.live_count() >= mv.target_workers:
                return Reply(200, {"status": done})
            return None

        def timed_out() -> Reply:
            mv.load_error = mv.load_error or (
                f"Workers were not ready within startup_timeout ({timeout} s).")
            return self.failed(mv)

        ctl.wait_for(Waiter(self.respond, check, time.monotonic() + timeout + 5, timed_out))

    def failed(self, mv: ModelVersion) -> Reply:
        """A register call's 500: its version removed, with why its workers did not start."""
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
