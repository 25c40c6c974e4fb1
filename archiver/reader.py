"""Reading and safely unpacking model archives.

Owns :func:`read_manifest` and :func:`unpack` for every layout a model can arrive in: a zip
(``.mar``, ``.zip``), a tar (``.tar.gz``, ``.tgz``) or a plain directory (``no-archive``).
Archives come from users and URLs, so unpacking trusts nothing in them: every entry name is
checked before anything is written, links and device files are refused, and the size and
file-count limits are checked from the headers first and enforced again while copying (a
header that understates a size must not get more bytes onto the disk). Extraction goes to a
temporary directory beside ``dest`` that is renamed into place, so a refused or broken
archive leaves nothing behind.

A tar made by ``torch-model-archiver`` keeps its files under a top-level ``<name>/`` folder;
that folder is stripped when it holds the manifest, so every layout unpacks alike.
This module never writes archives (:mod:`archiver.writer`).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
import stat
import sys
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from archiver.errors import ArchiveError, UnsafeArchiveError
from archiver.manifest import MANIFEST_PATH, Manifest, validate_model_name

__all__ = ["UnpackLimits", "read_manifest", "unpack"]

logger = logging.getLogger(__name__)

# A manifest is a few hundred bytes; a bigger one is a mistake or an attack.
_MAX_MANIFEST_BYTES = 1024 * 1024
_CHUNK = 1024 * 1024
_MANIFEST_PARTS = tuple(MANIFEST_PATH.split("/"))
_DRIVE = re.compile(r"^[A-Za-z]:")
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".mar", ".zip")


@dataclass(frozen=True)
class UnpackLimits:
    """Caps on what one archive may put on disk.

    :param max_bytes: total uncompressed bytes of all files.
    :param max_files: number of entries (files and directories).
    """

    max_bytes: int = 4 * 1024**3
    max_files: int = 10_000


@dataclass(frozen=True)
class _Entry:
    """One archive member after its name has been checked: ``parts`` is a safe relative path."""

    parts: tuple[str, ...]
    is_dir: bool
    size: int
    # Opens the member's data; None for directories.
    open: Callable[[], IO[bytes]] | None


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Return the manifest of an archive or model directory without unpacking it.

    With no ``MAR-INF/MANIFEST.json`` the manifest is derived: the model name is the file or
    directory name without its archive suffix, the version ``"1.0"``, the handler ``None``.

    :raises ArchiveError: the path is missing, not an archive, or its manifest is invalid.
    :raises UnsafeArchiveError: the archive holds an unsafe entry or passes the default limits.
    """
    src = Path(path)
    with _entries(src, UnpackLimits()) as entries:
        for entry in entries:
            if entry.parts == _MANIFEST_PARTS and entry.open is not None:
                with entry.open() as stream:
                    return _parse_manifest(_read_capped(stream, src), src)
    return _derived_manifest(src)


def unpack(
    path: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    limits: UnpackLimits = UnpackLimits(),
) -> Manifest:
    """Extract an archive (or copy a model directory) into ``dest`` and return its manifest.

    ``dest`` is created if absent and must otherwise be an empty directory. Files land at
    ``dest``'s root as in the archive; nothing is written outside ``dest``.

    :raises UnsafeArchiveError: an entry escapes ``dest`` (``..``, absolute path, drive
        letter), is a link or a device file, or the archive passes ``limits``.
    :raises ArchiveError: the source is missing or corrupt, or ``dest`` is not empty.
    """
    src = Path(path)
    target = Path(dest)
    if target.is_symlink() or (target.exists() and (not target.is_dir() or any(target.iterdir()))):
        raise ArchiveError(
            f"Cannot unpack into {str(target)!r}: it exists and is not an empty directory."
            " Remove it or choose another destination."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".unpack", dir=target.parent))
    try:
        with _entries(src, limits) as entries:
            _extract(entries, tmp, limits, src)
        manifest_file = tmp.joinpath(*_MANIFEST_PARTS)
        if manifest_file.is_file():
            with manifest_file.open("rb") as stream:
                manifest = _parse_manifest(_read_capped(stream, src), src)
        else:
            manifest = _derived_manifest(src)
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0o700; workers may run as another user
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("Unpacked %s into %s", src, target)
    return manifest


def _extract(entries: list[_Entry], root: Path, limits: UnpackLimits, src: Path) -> None:
    """Write checked entries under ``root``, counting bytes as they are copied."""
    written = 0
    for entry in entries:
        out = root.joinpath(*entry.parts)
        try:
            if entry.is_dir:
                out.mkdir(parents=True, exist_ok=True)
                continue
            assert entry.open is not None  # only directories lack data
            out.parent.mkdir(parents=True, exist_ok=True)
            copied = 0
            with entry.open() as stream, out.open("xb") as sink:
                while chunk := stream.read(_CHUNK):
                    copied += len(chunk)
                    if written + copied > limits.max_bytes:
                        raise UnsafeArchiveError(
                            f"Refusing {str(src)!r}: it unpacks to more than"
                            f" {limits.max_bytes} bytes (limit max_bytes); entry"
                            f" {'/'.join(entry.parts)!r} holds more than its header says."
                        )
                    sink.write(chunk)
        except FileExistsError:
            raise ArchiveError(
                f"Cannot unpack {str(src)!r}: entry {'/'.join(entry.parts)!r} appears twice"
                " or clashes with a directory. Rebuild the archive."
            ) from None
        except (OSError, zipfile.BadZipFile, zlib.error, EOFError, tarfile.TarError) as exc:
            raise ArchiveError(
                f"Cannot unpack {str(src)!r}: entry {'/'.join(entry.parts)!r} failed: {exc}."
                " The archive may be corrupt; rebuild it."
            ) from exc
        if copied != entry.size:
            raise UnsafeArchiveError(
                f"Refusing {str(src)!r}: entry {'/'.join(entry.parts)!r} holds {copied} bytes"
                f" but its header says {entry.size}. Rebuild the archive."
            )
        written += copied


@contextmanager
def _entries(src: Path, limits: UnpackLimits) -> Iterator[list[_Entry]]:
    """Yield the checked entries of ``src``; the archive stays open inside the block."""
    if src.is_dir():
        yield _strip_prefix(_dir_entries(src, limits))
        return
    if not src.is_file():
        raise ArchiveError(
            f"Model archive {str(src)!r} not found: check the path (a .mar, .zip, .tar.gz"
            " or a model directory)."
        )
    if zipfile.is_zipfile(src):
        try:
            with zipfile.ZipFile(src) as zf:
                yield _strip_prefix(_zip_entries(zf, src, limits))
        except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError) as exc:
            raise ArchiveError(
                f"Cannot read zip {str(src)!r}: {exc}. Rebuild the archive."
            ) from exc
        return
    if _is_tar(src):
        try:
            with tarfile.open(src, "r:*", tarinfo=_CappedTarInfo) as tf:
                yield _strip_prefix(_tar_entries(tf, src, limits))
        except (tarfile.TarError, zlib.error, EOFError) as exc:
            raise ArchiveError(
                f"Cannot read tar {str(src)!r}: {exc}. Rebuild the archive."
            ) from exc
        return
    raise ArchiveError(
        f"{str(src)!r} is not a model archive: expected a zip (.mar, .zip), a tar"
        " (.tar.gz, .tgz) or a directory."
    )


MAX_EXTENDED_HEADER = 1 << 20  # bytes of one pax or GNU long-name header


class _CappedTarInfo(tarfile.TarInfo):
    """tarfile reads a pax or GNU long-name header's declared size into memory at once, before
    any check of ours runs: a small .tar.gz can declare gigabytes. These headers are refused
    past MAX_EXTENDED_HEADER instead."""

    def _proc_pax(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        self._check_size("pax")
        return super()._proc_pax(tarfile_)  # type: ignore[misc]

    def _proc_gnulong(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        self._check_size("GNU long-name")
        return super()._proc_gnulong(tarfile_)  # type: ignore[misc]

    def _check_size(self, kind: str) -> None:
        if self.size > MAX_EXTENDED_HEADER:
            raise UnsafeArchiveError(
                f"The tar archive has a {kind} header of {self.size} bytes (at most "
                f"{MAX_EXTENDED_HEADER} are read). Rebuild the archive.")


def _is_tar(src: Path) -> bool:
    """tarfile.is_tarfile, with extended headers capped (see :class:`_CappedTarInfo`)."""
    try:
        with tarfile.open(src, "r:*", tarinfo=_CappedTarInfo):
            return True
    except tarfile.TarError:
        return False


def _safe_parts(name: str, src: Path) -> tuple[str, ...]:
    """Return ``name`` as relative path parts, refusing anything that could escape the target."""
    normal = name.replace("\\", "/")
    if "\x00" in normal or normal.startswith("/") or _DRIVE.match(normal):
        raise UnsafeArchiveError(
            f"Refusing {str(src)!r}: entry {name!r} is an absolute path."
            " Archive entries must be relative to the archive root."
        )
    parts = tuple(p for p in normal.split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafeArchiveError(
            f"Refusing {str(src)!r}: entry {name!r} escapes the target directory with '..'."
        )
    return parts


def _check_limits(count: int, total: int, src: Path, limits: UnpackLimits) -> None:
    if count > limits.max_files:
        raise UnsafeArchiveError(
            f"Refusing {str(src)!r}: it holds more than {limits.max_files} entries"
            " (limit max_files)."
        )
    if total > limits.max_bytes:
        raise UnsafeArchiveError(
            f"Refusing {str(src)!r}: it unpacks to more than {limits.max_bytes} bytes"
            " (limit max_bytes)."
        )


def _zip_entries(zf: zipfile.ZipFile, src: Path, limits: UnpackLimits) -> list[_Entry]:
    infos = zf.infolist()
    _check_limits(len(infos), sum(i.file_size for i in infos), src, limits)
    entries = []
    for info in infos:
        parts = _safe_parts(info.filename, src)
        kind = stat.S_IFMT(info.external_attr >> 16)
        if kind == stat.S_IFLNK:
            raise UnsafeArchiveError(
                f"Refusing {str(src)!r}: entry {info.filename!r} is a symbolic link."
                " Model archives may hold only files and directories."
            )
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise UnsafeArchiveError(
                f"Refusing {str(src)!r}: entry {info.filename!r} is a device or special file."
                " Model archives may hold only files and directories."
            )
        if info.flag_bits & 0x1:
            raise ArchiveError(
                f"Cannot unpack {str(src)!r}: entry {info.filename!r} is encrypted."
                " Rebuild the archive without a password."
            )
        if not parts:
            continue
        if info.is_dir() or kind == stat.S_IFDIR:
            entries.append(_Entry(parts, True, 0, None))
            continue
        # Open with a copy whose size is unbounded: zipfile would otherwise stop at the header's
        # size, hiding a lying header; _extract counts the real bytes against the limits.
        unbounded = copy.copy(info)
        unbounded.file_size = sys.maxsize

        def opener(i: zipfile.ZipInfo = unbounded) -> IO[bytes]:
            return zf.open(i)

        entries.append(_Entry(parts, False, info.file_size, opener))
    return entries


def _tar_entries(tf: tarfile.TarFile, src: Path, limits: UnpackLimits) -> list[_Entry]:
    # Iterate instead of getmembers(): headers are checked one by one and a bomb is refused
    # as soon as it passes a limit, before the rest of the stream is decompressed.
    entries = []
    count = total = 0
    for member in tf:
        count += 1
        total += max(member.size, 0)
        _check_limits(count, total, src, limits)
        parts = _safe_parts(member.name, src)
        if member.issym() or member.islnk():
            raise UnsafeArchiveError(
                f"Refusing {str(src)!r}: entry {member.name!r} is a"
                f" {'symbolic' if member.issym() else 'hard'} link to {member.linkname!r}."
                " Model archives may hold only files and directories."
            )
        if not (member.isreg() or member.isdir()):
            raise UnsafeArchiveError(
                f"Refusing {str(src)!r}: entry {member.name!r} is a device or special file."
                " Model archives may hold only files and directories."
            )
        if not parts:
            continue
        if member.isdir():
            entries.append(_Entry(parts, True, 0, None))
            continue

        def opener(m: tarfile.TarInfo = member) -> IO[bytes]:
            stream = tf.extractfile(m)
            assert stream is not None  # regular members always have data
            return stream

        entries.append(_Entry(parts, False, member.size, opener))
    return entries


def _dir_entries(src: Path, limits: UnpackLimits) -> list[_Entry]:
    """List a model directory, refusing links that leave it and special files."""
    root = src.resolve()
    entries = []
    count = total = 0
    for current, dirs, files in os.walk(src, followlinks=False):
        for name in sorted(dirs) + sorted(files):
            path = Path(current, name)
            rel = path.relative_to(src)
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                resolved = path.resolve()
                if not resolved.is_relative_to(root) or not resolved.is_file():
                    raise UnsafeArchiveError(
                        f"Refusing {str(src)!r}: {rel.as_posix()!r} is a symbolic link to"
                        f" {str(resolved)!r}, outside the model directory or not a file."
                    )
                st = resolved.stat()
            elif not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise UnsafeArchiveError(
                    f"Refusing {str(src)!r}: {rel.as_posix()!r} is a device or special file."
                )
            count += 1
            is_dir = stat.S_ISDIR(st.st_mode)
            total += 0 if is_dir else st.st_size
            _check_limits(count, total, src, limits)

            def opener(p: Path = path) -> IO[bytes]:
                return p.open("rb")

            if is_dir:
                entries.append(_Entry(rel.parts, True, 0, None))
            else:
                entries.append(_Entry(rel.parts, False, st.st_size, opener))
    return entries


def _strip_prefix(entries: list[_Entry]) -> list[_Entry]:
    """Drop a single top-level folder that holds the manifest (TorchServe's tar layout)."""
    if any(e.parts == _MANIFEST_PARTS for e in entries) or not entries:
        return entries
    tops = {e.parts[0] for e in entries}
    if len(tops) != 1:
        return entries
    (top,) = tops
    if not any(e.parts == (top, *_MANIFEST_PARTS) for e in entries):
        return entries
    return [_Entry(e.parts[1:], e.is_dir, e.size, e.open) for e in entries if len(e.parts) > 1]


def _read_capped(stream: IO[bytes], src: Path) -> bytes:
    data = stream.read(_MAX_MANIFEST_BYTES + 1)
    if len(data) > _MAX_MANIFEST_BYTES:
        raise ArchiveError(
            f"Invalid manifest in {str(src)!r}: {MANIFEST_PATH} is larger than"
            f" {_MAX_MANIFEST_BYTES} bytes."
        )
    return data


def _parse_manifest(data: bytes, src: Path) -> Manifest:
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArchiveError(
            f"Invalid manifest in {str(src)!r}: {MANIFEST_PATH} is not valid JSON ({exc})."
        ) from None
    try:
        return Manifest.from_dict(parsed)
    except ArchiveError as exc:
        raise ArchiveError(f"{exc} (in {str(src)!r})") from None


def _derived_manifest(src: Path) -> Manifest:
    """The manifest of an archive without one: name from the file name, version 1.0."""
    name = src.name
    for suffix in _ARCHIVE_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    try:
        validate_model_name(name)
    except ArchiveError as exc:
        raise ArchiveError(
            f"{str(src)!r} has no {MANIFEST_PATH}, and its name cannot be a model name: {exc}"
            " Rename it or add a manifest."
        ) from None
    return Manifest(model_name=name)
