"""archiver.war: the real torch-workflow-archiver's .war reads; bad manifests and unsafe
entries are refused with errors that say what to fix."""

from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

from archiver import ArchiveError, UnsafeArchiveError
from archiver.war import parse_manifest, unpack_workflow

_spec = importlib.util.spec_from_file_location(
    "workflow_archives", Path(__file__).parents[1] / "fixtures" / "workflows" / "archive.py")
workflow_archives = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workflow_archives)


def test_the_real_archivers_war_unpacks_with_its_nested_manifest(tmp_path):
    war = workflow_archives.write_workflow_archive(tmp_path, "tiny_pair")
    manifest = unpack_workflow(war, tmp_path / "out")
    assert (manifest.name, manifest.spec_file, manifest.handler) == (
        "tiny_pair", "spec.yaml", "handler.py")
    assert manifest.archiver_version == "0.2.15"
    assert (tmp_path / "out" / "spec.yaml").is_file()
    assert (tmp_path / "out" / "handler.py").is_file()


def _war(path: Path, manifest: object, files: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in (files or {"spec.yaml": "dag: {}", "h.py": ""}).items():
            zf.writestr(name, text)
        zf.writestr("WAR-INF/MANIFEST.json", json.dumps(manifest))
    return path


GOOD = {"createdOn": "06/12/2026 06:53:07", "archiverVersion": "0.2.15",
        "workflow": {"workflowName": "w", "specFile": "spec.yaml", "handler": "h.py"}}


def test_a_flat_manifest_is_refused_naming_the_missing_nested_field():
    flat = {"createdOn": "x", "archiverVersion": "0.2.15", "workflowName": "w",
            "specFile": "spec.yaml", "handler": "h.py"}
    with pytest.raises(ArchiveError, match=r"lacks workflow, workflow\.workflowName"):
        parse_manifest(json.dumps(flat).encode(), "w.war")


def test_a_manifest_without_created_on_is_refused():
    doc = {k: v for k, v in GOOD.items() if k != "createdOn"}
    with pytest.raises(ArchiveError, match="lacks createdOn"):
        parse_manifest(json.dumps(doc).encode(), "w.war")


def test_a_bad_workflow_name_is_refused():
    doc = {**GOOD, "workflow": {**GOOD["workflow"], "workflowName": "../x"}}
    with pytest.raises(ArchiveError, match="Invalid model name"):
        parse_manifest(json.dumps(doc).encode(), "w.war")


def test_a_manifest_naming_a_missing_spec_leaves_nothing_unpacked(tmp_path):
    war = _war(tmp_path / "w.war", {**GOOD, "workflow": {**GOOD["workflow"],
                                                         "specFile": "other.yaml"}})
    with pytest.raises(ArchiveError, match="'other.yaml'"):
        unpack_workflow(war, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_dotdot_entry_is_refused(tmp_path):
    war = _war(tmp_path / "w.war", GOOD, {"spec.yaml": "", "h.py": "", "../evil.py": "x"})
    with pytest.raises(UnsafeArchiveError):
        unpack_workflow(war, tmp_path / "out")
    assert not (tmp_path / "evil.py").exists()


def test_a_model_archive_is_not_a_workflow_archive(tmp_path):
    with zipfile.ZipFile(tmp_path / "m.war", "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "m"}}))
    with pytest.raises(ArchiveError, match="not a workflow archive"):
        unpack_workflow(tmp_path / "m.war", tmp_path / "out")
