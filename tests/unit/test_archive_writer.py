"""write_archive: every format round-trips, and bad input writes nothing."""

from __future__ import annotations

import json
import re
import tarfile
import zipfile
from pathlib import Path

import pytest

import archiver
from archiver import ArchiveError, Manifest, read_manifest, unpack, write_archive

FORMATS = ["default", "zip-store", "tgz", "no-archive"]
OUTPUT_NAME = {"default": "m.mar", "zip-store": "m.mar", "tgz": "m.tar.gz", "no-archive": "m"}


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model's source files in ``tmp_path/src``, which is also the working directory."""
    src = tmp_path / "src"
    (src / "assets" / "vocab").mkdir(parents=True)
    (src / "assets" / "__pycache__").mkdir()
    (src / "assets" / ".git").mkdir()
    (src / "handler.py").write_text("def handle(data, context):\n    return data\n")
    (src / "model.pt").write_bytes(bytes(range(256)) * 8)
    (src / "model.py").write_text("class Net: pass\n")
    (src / "requirements.txt").write_text("numpy\n")
    (src / "model-config.yaml").write_text("batchSize: 4\n")
    (src / "index_to_name.json").write_text('{"0": "cat"}')
    (src / "assets" / "labels.txt").write_text("cat\n")
    (src / "assets" / "vocab" / "words.txt").write_text("a b c\n")
    (src / "assets" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    (src / "assets" / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(src)
    return src


def _write(export: Path, archive_format: str = "default", **overrides: object) -> Path:
    kwargs: dict[str, object] = {
        "model_name": "m",
        "version": "2.0",
        "handler": "handler.py:handle",
        "serialized_file": "model.pt",
        "model_file": "model.py",
        "extra_files": "index_to_name.json,assets",
        "requirements_file": "requirements.txt",
        "config_file": "model-config.yaml",
        "export_path": export,
        "archive_format": archive_format,
    }
    kwargs.update(overrides)
    return write_archive(**kwargs)  # type: ignore[arg-type]


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("archive_format", FORMATS)
def test_write_archive_round_trips_every_format(
    inputs: Path, tmp_path: Path, archive_format: str
) -> None:
    out = _write(tmp_path / "out", archive_format)
    assert out == tmp_path / "out" / OUTPUT_NAME[archive_format]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [out.name]  # no temp left

    manifest = read_manifest(out)
    expected = Manifest(
        model_name="m",
        model_version="2.0",
        handler="handler.py:handle",
        serialized_file="model.pt",
        model_file="model.py",
        requirements_file="requirements.txt",
        config_file="model-config.yaml",
        created_on=manifest.created_on,
        archiver_version=archiver.__version__,
    )
    assert manifest == expected
    assert re.fullmatch(r"\d\d/\d\d/\d{4} \d\d:\d\d:\d\d", manifest.created_on or "")

    assert unpack(out, tmp_path / "unpacked") == manifest
    tree = _tree(tmp_path / "unpacked")
    assert json.loads(tree.pop("MAR-INF/MANIFEST.json")) == manifest.to_dict()
    assert tree == {
        "handler.py": (inputs / "handler.py").read_bytes(),
        "model.pt": (inputs / "model.pt").read_bytes(),
        "model.py": (inputs / "model.py").read_bytes(),
        "requirements.txt": b"numpy\n",
        "model-config.yaml": b"batchSize: 4\n",
        "index_to_name.json": b'{"0": "cat"}',
        "labels.txt": b"cat\n",
        "vocab/words.txt": b"a b c\n",
    }


def test_write_archive_default_is_deflated_zip_store_is_stored(
    inputs: Path, tmp_path: Path
) -> None:
    deflated = _write(tmp_path / "out", "default")
    stored = _write(tmp_path / "out", "zip-store", model_name="s")
    with zipfile.ZipFile(deflated) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_DEFLATED}
        assert zf.namelist()[-1] == "MAR-INF/MANIFEST.json"
    with zipfile.ZipFile(stored) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}


def test_write_archive_tgz_keeps_files_under_model_name_like_torchserve(
    inputs: Path, tmp_path: Path
) -> None:
    out = _write(tmp_path / "out", "tgz", extra_files="")
    with tarfile.open(out) as tf:
        assert sorted(tf.getnames()) == [
            "m/MAR-INF/MANIFEST.json",
            "m/handler.py",
            "m/model-config.yaml",
            "m/model.pt",
            "m/model.py",
            "m/requirements.txt",
        ]


def test_write_archive_manifest_omits_absent_optional_keys(inputs: Path, tmp_path: Path) -> None:
    out = write_archive(model_name="m", handler="image_classifier", export_path=tmp_path / "out")
    with zipfile.ZipFile(out) as zf:
        assert zf.namelist() == ["MAR-INF/MANIFEST.json"]
        data = json.loads(zf.read("MAR-INF/MANIFEST.json"))
    assert list(data) == ["createdOn", "runtime", "model", "archiverVersion"]
    assert data["model"] == {"modelName": "m", "modelVersion": "1.0", "handler": "image_classifier"}


def test_write_archive_accepts_handler_path_without_py_suffix(inputs: Path, tmp_path: Path) -> None:
    out = write_archive(
        model_name="m", handler=str(inputs / "handler"), export_path=tmp_path / "out"
    )
    assert read_manifest(out).handler == "handler"
    with zipfile.ZipFile(out) as zf:
        assert "handler.py" in zf.namelist()


def test_write_archive_accepts_extra_files_as_a_list(inputs: Path, tmp_path: Path) -> None:
    out = write_archive(
        model_name="m",
        handler="handler.py",
        extra_files=[inputs / "index_to_name.json", "assets/vocab"],
        export_path=tmp_path / "out",
    )
    with zipfile.ZipFile(out) as zf:
        assert sorted(zf.namelist()) == [
            "MAR-INF/MANIFEST.json",
            "handler.py",
            "index_to_name.json",
            "words.txt",
        ]


def _assert_nothing_written(tmp_path: Path) -> None:
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize(
    ("overrides", "wording"),
    [
        ({"serialized_file": "nope.pt"}, "File 'nope.pt' given as --serialized-file not found"),
        ({"model_file": "nope.py"}, "File 'nope.py' given as --model-file not found"),
        ({"requirements_file": "r.txt"}, "File 'r.txt' given as --requirements-file not found"),
        ({"config_file": "c.yaml"}, "File 'c.yaml' given as --config-file not found"),
        ({"extra_files": "assets,gone.json"}, "Extra file 'gone.json' not found"),
        ({"handler": "missing.py:handle"}, "Handler file 'missing.py' not found"),
        ({"handler": "dir/missing"}, "Handler file 'dir/missing' not found"),
        ({"handler": ""}, "No handler given: pass --handler"),
        ({"handler": None}, "No handler given: pass --handler"),
        ({"model_name": "bad/name"}, "Invalid model name 'bad/name': it must match"),
        ({"model_name": "-m"}, "Invalid model name '-m'"),
        ({"version": "../1"}, "Invalid model version '../1'"),
        ({"archive_format": "rar"}, "Unknown archive format 'rar': use one of 'default'"),
    ],
)
def test_write_archive_refuses_bad_input_and_writes_nothing(
    inputs: Path, tmp_path: Path, overrides: dict[str, object], wording: str
) -> None:
    with pytest.raises(ArchiveError) as info:
        _write(tmp_path / "out", **overrides)
    assert wording in str(info.value)
    _assert_nothing_written(tmp_path)


def test_write_archive_refuses_two_inputs_with_one_name(inputs: Path, tmp_path: Path) -> None:
    (inputs / "other").mkdir()
    (inputs / "other" / "model.pt").write_bytes(b"different")
    with pytest.raises(ArchiveError, match="Two inputs would both be stored as 'model.pt'"):
        _write(tmp_path / "out", extra_files="other/model.pt")
    _assert_nothing_written(tmp_path)


def test_write_archive_refuses_missing_export_path_and_does_not_create_it(
    inputs: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ArchiveError) as info:
        _write(missing)
    assert str(info.value) == (
        f"Export path {str(missing)!r} is not a directory: create it first"
        " or pass an existing --export-path."
    )
    assert not missing.exists()


@pytest.mark.parametrize("archive_format", FORMATS)
def test_write_archive_refuses_existing_output_without_force(
    inputs: Path, tmp_path: Path, archive_format: str
) -> None:
    first = _write(tmp_path / "out", archive_format)
    before = _tree(first) if first.is_dir() else first.read_bytes()
    with pytest.raises(ArchiveError) as info:
        _write(tmp_path / "out", archive_format, version="3.0")
    assert str(info.value) == (
        f"Output {str(first)!r} already exists: pass --force (force=True) to overwrite it."
    )
    assert (_tree(first) if first.is_dir() else first.read_bytes()) == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [first.name]


@pytest.mark.parametrize("archive_format", FORMATS)
def test_write_archive_overwrites_existing_output_with_force(
    inputs: Path, tmp_path: Path, archive_format: str
) -> None:
    first = _write(tmp_path / "out", archive_format)
    second = _write(tmp_path / "out", archive_format, version="3.0", extra_files="", force=True)
    assert second == first
    assert read_manifest(second).model_version == "3.0"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [first.name]
    if archive_format == "no-archive":
        assert not (second / "labels.txt").exists()  # replaced, not merged
