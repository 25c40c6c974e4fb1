"""read_manifest and unpack: every layout reads, and unsafe archives write nothing."""

from __future__ import annotations

import io
import json
import os
import random
import stat
import struct
import tarfile
import zipfile
from pathlib import Path

import pytest

from archiver import ArchiveError, Manifest, UnpackLimits, UnsafeArchiveError, read_manifest, unpack

MANIFEST = {"runtime": "python", "model": {"modelName": "m", "modelVersion": "1.0", "handler": "h"}}


def _zip(path: Path, entries: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", method) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


def _snapshot(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """``tmp_path`` with an empty ``out/`` folder that unpack targets ``out/model`` inside."""
    (tmp_path / "out").mkdir()
    return tmp_path


def _refused(work: Path, archive: Path, wording: str, limits: UnpackLimits | None = None) -> None:
    """Assert unpack refuses ``archive`` with ``wording`` and leaves no file anywhere."""
    before = _snapshot(work)
    with pytest.raises(UnsafeArchiveError) as info:
        unpack(archive, work / "out" / "model", limits or UnpackLimits())
    assert wording in str(info.value)
    assert str(info.value).startswith(f"Refusing {str(archive)!r}: ")
    assert _snapshot(work) == before  # nothing in out/, nothing beside it, no temp dir left


def test_unpack_refuses_zip_slip_entry(work: Path) -> None:
    archive = _zip(work / "slip.mar", {"ok.txt": b"1", "../evil.txt": b"x"})
    _refused(work, archive, "entry '../evil.txt' escapes the target directory with '..'")
    assert not (work / "evil.txt").exists()


def test_unpack_refuses_zip_slip_with_backslashes(work: Path) -> None:
    archive = _zip(work / "slip.mar", {"a\\..\\..\\evil.txt": b"x"})
    _refused(work, archive, "escapes the target directory")


@pytest.mark.parametrize("name", ["/etc/evil", "C:/evil.txt", "c:\\evil.txt"])
def test_unpack_refuses_zip_absolute_path(work: Path, name: str) -> None:
    archive = work / "abs.mar"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("placeholder")
        info.filename = name  # ZipInfo() would strip the leading '/' and the drive
        zf.writestr(info, b"x")
    _refused(work, archive, f"entry {name!r} is an absolute path")


def test_unpack_refuses_zip_symlink_entry(work: Path) -> None:
    archive = work / "link.mar"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("passwd")
        info.create_system = 3
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    _refused(work, archive, "entry 'passwd' is a symbolic link")


def test_unpack_refuses_zip_device_entry(work: Path) -> None:
    archive = work / "dev.mar"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("fifo")
        info.create_system = 3
        info.external_attr = (stat.S_IFIFO | 0o644) << 16
        zf.writestr(info, b"")
    _refused(work, archive, "entry 'fifo' is a device or special file")


def test_unpack_refuses_tar_symlink(work: Path) -> None:
    archive = _tar(
        work / "link.tar.gz", [(_member("passwd", tarfile.SYMTYPE, "/etc/passwd"), None)]
    )
    _refused(work, archive, "entry 'passwd' is a symbolic link to '/etc/passwd'")


def test_unpack_refuses_tar_hardlink(work: Path) -> None:
    archive = _tar(
        work / "link.tar.gz",
        [(_member("a.txt"), b"a"), (_member("b.txt", tarfile.LNKTYPE, "a.txt"), None)],
    )
    _refused(work, archive, "entry 'b.txt' is a hard link to 'a.txt'")


def test_unpack_refuses_tar_device_file(work: Path) -> None:
    archive = _tar(work / "dev.tar.gz", [(_member("null", tarfile.CHRTYPE), None)])
    _refused(work, archive, "entry 'null' is a device or special file")


def test_unpack_refuses_tar_slip_entry(work: Path) -> None:
    archive = _tar(work / "slip.tgz", [(_member("m/../../evil.txt"), b"x")])
    _refused(work, archive, "entry 'm/../../evil.txt' escapes the target directory")


def test_unpack_refuses_tar_absolute_path(work: Path) -> None:
    archive = _tar(work / "abs.tgz", [(_member("/tmp/evil.txt"), b"x")])
    _refused(work, archive, "entry '/tmp/evil.txt' is an absolute path")


def test_unpack_refuses_zip_with_too_many_files(work: Path) -> None:
    archive = _zip(work / "many.mar", {f"f{i}.txt": b"" for i in range(6)})
    _refused(
        work, archive, "it holds more than 5 entries (limit max_files)", UnpackLimits(max_files=5)
    )


def test_unpack_refuses_tar_with_too_many_files(work: Path) -> None:
    archive = _tar(work / "many.tgz", [(_member(f"f{i}.txt"), b"") for i in range(6)])
    _refused(work, archive, "more than 5 entries", UnpackLimits(max_files=5))


def test_unpack_refuses_zip_with_too_many_bytes(work: Path) -> None:
    archive = _zip(work / "big.mar", {"a.bin": b"\0" * 600, "b.bin": b"\0" * 600})
    _refused(
        work,
        archive,
        "it unpacks to more than 1000 bytes (limit max_bytes)",
        UnpackLimits(max_bytes=1000),
    )


def test_unpack_refuses_tar_with_too_many_bytes(work: Path) -> None:
    archive = _tar(work / "big.tgz", [(_member("a.bin"), b"\0" * 1001)])
    _refused(work, archive, "more than 1000 bytes", UnpackLimits(max_bytes=1000))


def _understate_zip_size(path: Path, name: str, fake_size: int) -> None:
    """Patch both headers of ``name`` to claim ``fake_size`` uncompressed bytes."""
    data = bytearray(path.read_bytes())
    encoded = name.encode()
    local = data.find(b"PK\x03\x04")
    assert data[local + 30 : local + 30 + len(encoded)] == encoded
    struct.pack_into("<I", data, local + 22, fake_size)
    central = data.find(b"PK\x01\x02")
    assert data[central + 46 : central + 46 + len(encoded)] == encoded
    struct.pack_into("<I", data, central + 24, fake_size)
    path.write_bytes(bytes(data))


def test_unpack_refuses_zip_whose_header_understates_size_past_the_limit(work: Path) -> None:
    archive = _zip(work / "bomb.mar", {"bomb.bin": b"\0" * 200_000})
    _understate_zip_size(archive, "bomb.bin", 10)
    with zipfile.ZipFile(archive) as zf:
        assert zf.getinfo("bomb.bin").file_size == 10  # the header passes the pre-check
    _refused(
        work,
        archive,
        "unpacks to more than 1000 bytes (limit max_bytes); entry 'bomb.bin'"
        " holds more than its header says",
        UnpackLimits(max_bytes=1000),
    )


def test_unpack_refuses_zip_whose_header_understates_size_within_the_limit(work: Path) -> None:
    archive = _zip(work / "liar.mar", {"liar.bin": b"\0" * 5000})
    _understate_zip_size(archive, "liar.bin", 10)
    _refused(work, archive, "entry 'liar.bin' holds 5000 bytes but its header says 10")


def test_unpack_refuses_directory_with_symlink_outside(work: Path) -> None:
    model = work / "model_dir"
    model.mkdir()
    (model / "ok.txt").write_text("ok")
    (work / "secret").write_text("secret")
    (model / "leak").symlink_to(work / "secret")
    before = _snapshot(work)
    with pytest.raises(UnsafeArchiveError, match="'leak' is a symbolic link to .*outside"):
        unpack(model, work / "out" / "model")
    assert _snapshot(work) == before


def test_unpack_refuses_directory_past_the_limits(work: Path) -> None:
    model = work / "model_dir"
    model.mkdir()
    (model / "a.bin").write_bytes(b"\0" * 2000)
    with pytest.raises(UnsafeArchiveError, match="more than 1000 bytes"):
        unpack(model, work / "out" / "model", UnpackLimits(max_bytes=1000))
    assert list((work / "out").iterdir()) == []


def test_unpack_copies_directory_and_follows_links_inside_it(work: Path) -> None:
    model = work / "model_dir"
    (model / "MAR-INF").mkdir(parents=True)
    (model / "MAR-INF" / "MANIFEST.json").write_text(json.dumps(MANIFEST))
    (model / "weights.pt").write_bytes(b"w")
    (model / "alias.pt").symlink_to("weights.pt")
    manifest = unpack(model, work / "out" / "model")
    assert manifest == Manifest(model_name="m", handler="h")
    dest = work / "out" / "model"
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        "MAR-INF",
        "MAR-INF/MANIFEST.json",
        "alias.pt",
        "weights.pt",
    ]
    assert not (dest / "alias.pt").is_symlink()
    assert (dest / "alias.pt").read_bytes() == b"w"


def test_read_manifest_derives_name_from_directory_without_manifest(tmp_path: Path) -> None:
    model = tmp_path / "my-model.v2"
    model.mkdir()
    (model / "weights.pt").write_bytes(b"w")
    assert read_manifest(model) == Manifest(model_name="my-model.v2", model_version="1.0")
    assert unpack(model, tmp_path / "dest") == Manifest(model_name="my-model.v2")
    assert (tmp_path / "dest" / "weights.pt").read_bytes() == b"w"


@pytest.mark.parametrize("filename", ["plain.zip", "plain.mar", "plain.tar.gz", "plain.tgz"])
def test_read_manifest_derives_name_from_archive_without_manifest(
    tmp_path: Path, filename: str
) -> None:
    path = tmp_path / filename
    if filename.endswith(("gz", "tgz")):
        _tar(path, [(_member("weights.pt"), b"w")])
    else:
        _zip(path, {"weights.pt": b"w"})
    assert read_manifest(path) == Manifest(model_name="plain", model_version="1.0", handler=None)


def test_read_manifest_refuses_underivable_name(tmp_path: Path) -> None:
    model = tmp_path / "bad name"
    model.mkdir()
    with pytest.raises(ArchiveError, match="has no MAR-INF/MANIFEST.json, and its name cannot be"):
        read_manifest(model)


def test_read_manifest_reports_invalid_json(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "m.mar", {"MAR-INF/MANIFEST.json": b"{nope"})
    with pytest.raises(ArchiveError, match=r"MAR-INF/MANIFEST.json is not valid JSON"):
        read_manifest(archive)


def test_read_manifest_reports_bad_manifest_key_and_archive(tmp_path: Path) -> None:
    bad = {"model": {"modelName": "a b"}}
    archive = _zip(tmp_path / "m.mar", {"MAR-INF/MANIFEST.json": json.dumps(bad).encode()})
    with pytest.raises(ArchiveError) as info:
        read_manifest(archive)
    assert str(info.value).startswith("Invalid manifest key 'model.modelName': Invalid model name")
    assert str(info.value).endswith(f"(in {str(archive)!r})")


def test_read_manifest_refuses_missing_and_non_archive_paths(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match=r"Model archive '.*gone.mar' not found"):
        read_manifest(tmp_path / "gone.mar")
    text = tmp_path / "notes.mar"
    text.write_text("hello")
    with pytest.raises(ArchiveError, match="is not a model archive: expected a zip"):
        read_manifest(text)


def test_read_manifest_refuses_unsafe_archive(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "slip.mar", {"../x": b"x"})
    with pytest.raises(UnsafeArchiveError, match="escapes the target directory"):
        read_manifest(archive)


def test_unpack_strips_a_top_folder_holding_the_manifest(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "m.tar.gz",
        [
            (_member("m/MAR-INF/MANIFEST.json"), json.dumps(MANIFEST).encode()),
            (_member("m/sub/w.pt"), b"w"),
        ],
    )
    assert read_manifest(archive) == Manifest(model_name="m", handler="h")
    unpack(archive, tmp_path / "dest")
    dest = tmp_path / "dest"
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == ["MAR-INF/MANIFEST.json", "sub/w.pt"]


def test_unpack_keeps_a_top_folder_without_manifest(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "plain.zip", {"weights/w.pt": b"w"})
    unpack(archive, tmp_path / "dest")
    assert (tmp_path / "dest" / "weights" / "w.pt").read_bytes() == b"w"


def test_unpack_into_existing_empty_directory(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "m.mar", {"w.pt": b"w"})
    (tmp_path / "dest").mkdir()
    unpack(archive, tmp_path / "dest")
    assert (tmp_path / "dest" / "w.pt").read_bytes() == b"w"
    assert sorted(os.listdir(tmp_path)) == ["dest", "m.mar"]


def test_unpack_refuses_non_empty_destination(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "m.mar", {"w.pt": b"w"})
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "keep.txt").write_text("keep")
    with pytest.raises(ArchiveError) as info:
        unpack(archive, tmp_path / "dest")
    assert str(info.value) == (
        f"Cannot unpack into {str(tmp_path / 'dest')!r}: it exists and is not an empty"
        " directory. Remove it or choose another destination."
    )
    assert os.listdir(tmp_path / "dest") == ["keep.txt"]


def test_unpack_refuses_duplicate_zip_entries(work: Path) -> None:
    archive = work / "dup.mar"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("a.txt", b"1")
        with pytest.warns(UserWarning, match="Duplicate name"):
            zf.writestr("a.txt", b"2")
    with pytest.raises(ArchiveError, match="entry 'a.txt' appears twice"):
        unpack(archive, work / "out" / "model")
    assert list((work / "out").iterdir()) == []


def test_unpack_reports_corrupt_zip(work: Path) -> None:
    archive = _zip(work / "bad.mar", {"a.bin": random.Random(0).randbytes(5000)})
    data = bytearray(archive.read_bytes())
    data[100:200] = b"\xff" * 100  # damage the compressed data, keep both headers
    archive.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="The archive may be corrupt; rebuild it."):
        unpack(archive, work / "out" / "model")
    assert list((work / "out").iterdir()) == []
