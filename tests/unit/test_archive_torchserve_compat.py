"""Archives from TorchServe's own torch-model-archiver 0.12 read exactly like ours."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from archiver import Manifest, read_manifest, unpack, write_archive

pytest.importorskip("model_archiver")
TORCH_MODEL_ARCHIVER = Path(sys.executable).with_name("torch-model-archiver")
if not TORCH_MODEL_ARCHIVER.exists():
    pytest.skip("torch-model-archiver is not installed next to python", allow_module_level=True)

FORMATS = ["default", "zip-store", "tgz", "no-archive"]
OUTPUT_NAME = {"default": "m.mar", "zip-store": "m.mar", "tgz": "m.tar.gz", "no-archive": "m"}
ARGS = {
    "model_name": "m",
    "version": "2.0",
    "handler": "handler.py",
    "serialized_file": "model.pt",
    "model_file": "model.py",
    "extra_files": "index_to_name.json,assets",
    "requirements_file": "requirements.txt",
    "config_file": "model-config.yaml",
}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "assets" / "vocab").mkdir(parents=True)
    (src / "handler.py").write_text("def handle(data, context):\n    return data\n")
    (src / "model.pt").write_bytes(bytes(range(256)) * 4)
    (src / "model.py").write_text("class Net: pass\n")
    (src / "requirements.txt").write_text("numpy\n")
    (src / "model-config.yaml").write_text("batchSize: 4\n")
    (src / "index_to_name.json").write_text('{"0": "cat"}')
    (src / "assets" / "labels.txt").write_text("cat\n")
    (src / "assets" / "vocab" / "words.txt").write_text("a b c\n")
    for name in ("ts", "ours"):
        (tmp_path / name).mkdir()
    return src


def _torchserve_archive(src: Path, export: Path, archive_format: str) -> Path:
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in ARGS.items()]
    # torch-model-archiver stages files in $TMPDIR/<model-name>: keep parallel runs apart.
    env = {**os.environ, "TMPDIR": str(export.parent)}
    done = subprocess.run(
        [
            TORCH_MODEL_ARCHIVER,
            *flags,
            f"--export-path={export}",
            f"--archive-format={archive_format}",
        ],
        cwd=src,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return export / OUTPUT_NAME[archive_format]


def _ours(src: Path, export: Path, archive_format: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(src)
    return write_archive(**ARGS, export_path=export, archive_format=archive_format)  # type: ignore[arg-type]


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _comparable(manifest: Manifest) -> Manifest:
    return dataclasses.replace(manifest, created_on=None, archiver_version=None)


@pytest.mark.parametrize("archive_format", FORMATS)
def test_torchserve_archive_reads_like_ours(
    src: Path, tmp_path: Path, archive_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = _torchserve_archive(src, tmp_path / "ts", archive_format)
    ours = _ours(src, tmp_path / "ours", archive_format, monkeypatch)
    assert ours.name == theirs.name

    their_manifest = read_manifest(theirs)
    assert their_manifest.archiver_version == "0.12.0"
    assert (
        _comparable(their_manifest)
        == _comparable(read_manifest(ours))
        == Manifest(
            model_name="m",
            model_version="2.0",
            handler="handler.py",
            serialized_file="model.pt",
            model_file="model.py",
            requirements_file="requirements.txt",
            config_file="model-config.yaml",
        )
    )

    assert unpack(theirs, tmp_path / "ts-unpacked") == their_manifest
    unpack(ours, tmp_path / "ours-unpacked")
    their_files = _files(tmp_path / "ts-unpacked")
    our_files = _files(tmp_path / "ours-unpacked")
    assert their_files.pop("MAR-INF/MANIFEST.json")
    assert our_files.pop("MAR-INF/MANIFEST.json")
    assert their_files == our_files
    assert sorted(our_files) == [
        "handler.py",
        "index_to_name.json",
        "labels.txt",
        "model-config.yaml",
        "model.pt",
        "model.py",
        "requirements.txt",
        "vocab/words.txt",
    ]


@pytest.mark.parametrize("archive_format", ["default", "zip-store", "tgz"])
def test_our_archive_has_torchserve_member_names(
    src: Path, tmp_path: Path, archive_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = _torchserve_archive(src, tmp_path / "ts", archive_format)
    ours = _ours(src, tmp_path / "ours", archive_format, monkeypatch)
    if archive_format == "tgz":
        with tarfile.open(theirs) as a, tarfile.open(ours) as b:
            assert sorted(a.getnames()) == sorted(b.getnames())
    else:
        with zipfile.ZipFile(theirs) as a, zipfile.ZipFile(ours) as b:
            assert sorted(a.namelist()) == sorted(b.namelist())
            assert {i.compress_type for i in a.infolist()} == {
                i.compress_type for i in b.infolist()
            }
