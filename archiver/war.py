"""Workflow archives (``.war``): TorchServe's format, read safely.

A ``.war`` is a zip made by ``torch-workflow-archiver``: the spec, the handler and any extra
files flat at its root, and ``WAR-INF/MANIFEST.json`` whose fields nest under ``workflow``
(``{"createdOn", "workflow": {"workflowName", "specFile", "handler"}, "archiverVersion"}``).
Unpacking goes through :func:`archiver.reader.unpack`, so a ``..`` entry, a link or an
archive past the limits is refused as a ``.mar`` would be. The manifest is checked for the
fields TorchServe's Java reader requires.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from archiver.errors import ArchiveError
from archiver.manifest import validate_model_name
from archiver.reader import UnpackLimits, unpack

MANIFEST_PATH = "WAR-INF/MANIFEST.json"
_MAX_MANIFEST_BYTES = 1 << 20
REQUIRED = ("workflow", "archiverVersion", "createdOn")  # as WorkflowArchive.java checks


@dataclass(frozen=True)
class WorkflowManifest:
    """What a ``.war``'s manifest says: its name, spec file and handler file (basenames)."""

    name: str
    spec_file: str
    handler: str
    archiver_version: str
    created_on: str


def parse_manifest(data: bytes, src: str) -> WorkflowManifest:
    """A ``WAR-INF/MANIFEST.json``'s bytes as a :class:`WorkflowManifest`; ``src`` names the
    archive in errors."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArchiveError(f"Invalid manifest in {src!r}: {MANIFEST_PATH} is not valid JSON "
                           f"({exc}).") from None
    if not isinstance(doc, dict):
        raise ArchiveError(f"Invalid manifest in {src!r}: {MANIFEST_PATH} must be an object.")
    missing = [key for key in REQUIRED if key not in doc]
    workflow = doc.get("workflow")
    if not isinstance(workflow, dict):
        missing.append("workflow.workflowName")
        workflow = {}
    elif "workflowName" not in workflow:
        missing.append("workflow.workflowName")
    if missing:
        raise ArchiveError(f"Invalid manifest in {src!r}: {MANIFEST_PATH} lacks "
                           f"{', '.join(dict.fromkeys(missing))}. Rebuild it with "
                           "torch-workflow-archiver.")
    name = validate_model_name(workflow["workflowName"])
    spec_file, handler = workflow.get("specFile"), workflow.get("handler")
    for key, value in (("specFile", spec_file), ("handler", handler)):
        if not isinstance(value, str) or not value or os.path.basename(value) != value:
            raise ArchiveError(f"Invalid manifest in {src!r}: workflow.{key} must name a file "
                               f"at the archive's root, got {value!r}.")
    return WorkflowManifest(name, str(spec_file), str(handler),
                            str(doc["archiverVersion"]), str(doc["createdOn"]))


def unpack_workflow(path: str | os.PathLike[str], dest: str | os.PathLike[str],
                    limits: UnpackLimits | None = None) -> WorkflowManifest:
    """Extract a ``.war`` into ``dest`` (created; it must be absent or empty) and return its
    manifest, once its spec and handler files are there. Nothing is left in ``dest`` when it
    fails."""
    target = Path(dest)
    unpack(path, target, limits or UnpackLimits())
    try:
        manifest_file = target / MANIFEST_PATH
        if not manifest_file.is_file():
            raise ArchiveError(f"{str(path)!r} is not a workflow archive: it has no "
                               f"{MANIFEST_PATH}. Build it with torch-workflow-archiver.")
        with manifest_file.open("rb") as stream:
            data = stream.read(_MAX_MANIFEST_BYTES + 1)
        if len(data) > _MAX_MANIFEST_BYTES:
            raise ArchiveError(f"Invalid manifest in {str(path)!r}: {MANIFEST_PATH} is larger "
                               f"than {_MAX_MANIFEST_BYTES} bytes.")
        manifest = parse_manifest(data, str(path))
        for name in (manifest.spec_file, manifest.handler):
            if not (target / name).is_file():
                raise ArchiveError(f"Workflow archive {str(path)!r} names {name!r} in its "
                                   "manifest, but holds no such file.")
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return manifest
