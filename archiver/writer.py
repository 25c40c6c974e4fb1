"""Writing model archives in TorchServe's layouts.

Owns :func:`write_archive`: it checks every input first, then writes into a temporary file
or directory inside ``export_path`` and renames it into place, so a failure never leaves a
half-written archive and readers never see one being written. It does not read archives
(:mod:`archiver.reader`) or parse command lines (:mod:`archiver.cli`).

Layouts, all matching ``torch-model-archiver`` 0.12:

* ``default`` / ``zip-store``: ``<name>.mar``, a zip (deflated / stored) with every file at
  the root by basename and ``MAR-INF/MANIFEST.json``.
* ``tgz``: ``<name>.tar.gz`` holding the same files under a top-level ``<name>/`` folder,
  which is where TorchServe puts them (its frontend unpacks and enters that folder).
* ``no-archive``: a directory ``<name>/`` with the same files.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

from archiver.errors import ArchiveError
from archiver.manifest import MANIFEST_PATH, Manifest, validate_model_name, validate_version

__all__ = ["ARCHIVE_FORMATS", "archive_path", "write_archive"]

logger = logging.getLogger(__name__)

#: ``--archive-format`` value -> suffix of the output name.
ARCHIVE_FORMATS = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}

# TorchServe skips these folders when it copies extra-file directories; we match its output.
_SKIPPED_DIRS = frozenset({"__pycache__", "__MACOSX"})


def archive_path(export_path: str | os.PathLike[str], model_name: str, archive_format: str) -> Path:
    """Return where :func:`write_archive` puts the archive for these arguments."""
    if archive_format not in ARCHIVE_FORMATS:
        raise ArchiveError(
            f"Unknown archive format {archive_format!r}: use one of"
            f" {', '.join(repr(f) for f in ARCHIVE_FORMATS)}."
        )
    return Path(export_path) / f"{model_name}{ARCHIVE_FORMATS[archive_format]}"


def write_archive(
    *,
    model_name: str,
    version: str = "1.0",
    handler: str | None,
    serialized_file: str | os.PathLike[str] | None = None,
    model_file: str | os.PathLike[str] | None = None,
    extra_files: str | Iterable[str | os.PathLike[str]] = (),
    requirements_file: str | os.PathLike[str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
    export_path: str | os.PathLike[str] = ".",
    archive_format: str = "default",
    force: bool = False,
) -> Path:
    """Package a model and return the path of the archive written.

    :param model_name: must match :data:`archiver.manifest.MODEL_NAME_PATTERN`.
    :param version: the model version recorded in the manifest.
    :param handler: a built-in handler name (``image_classifier``) recorded as is, or a
        ``file.py[:function]`` path: the file is copied to the archive root and its basename
        recorded, keeping ``:function``.
    :param extra_files: files and directories, as a list or a comma-separated string; a
        directory's contents are copied to the archive root keeping their relative paths.
    :param export_path: an existing directory; it is not created.
    :param archive_format: one of :data:`ARCHIVE_FORMATS`.
    :param force: replace an existing output instead of failing.
    :raises ArchiveError: on any bad input, before anything is written.
    """
    validate_model_name(model_name)
    validate_version(version)
    export_dir = Path(export_path)
    if not export_dir.is_dir():
        raise ArchiveError(
            f"Export path {str(export_dir)!r} is not a directory: create it first"
            " or pass an existing --export-path."
        )
    target = archive_path(export_dir, model_name, archive_format)
    if (target.exists() or target.is_symlink()) and not force:
        raise ArchiveError(
            f"Output {str(target)!r} already exists: pass --force (force=True) to overwrite it."
        )

    files: dict[str, Path] = {}
    recorded_handler = _resolve_handler(handler, files)
    serialized_name = _add_named(files, serialized_file, "serialized_file")
    model_file_name = _add_named(files, model_file, "model_file")
    requirements_name = _add_named(files, requirements_file, "requirements_file")
    config_name = _add_named(files, config_file, "config_file")
    for arcname, path in _extra_files(extra_files):
        _add(files, arcname, path)

    # Imported here: the package's __init__ imports this module before it is complete.
    from archiver import __version__

    manifest = Manifest(
        model_name=model_name,
        model_version=version,
        handler=recorded_handler,
        created_on=datetime.now().strftime("%d/%m/%Y %H:%M:%S"),
        archiver_version=__version__,
        serialized_file=serialized_name,
        model_file=model_file_name,
        requirements_file=requirements_name,
        config_file=config_name,
    )
    manifest_bytes = json.dumps(manifest.to_dict(), indent=2).encode("utf-8")

    try:
        _write(target, model_name, archive_format, files, manifest_bytes)
    except OSError as exc:
        raise ArchiveError(
            f"Could not write {str(target)!r}: {exc}. Check the export path's permissions"
            " and free space."
        ) from exc
    logger.info("Wrote model archive %s (%d files)", target, len(files) + 1)
    return target


def _write(
    target: Path, model_name: str, archive_format: str, files: dict[str, Path], manifest: bytes
) -> None:
    """Write the archive to a temporary name beside ``target``, then rename it into place."""
    export_dir = target.parent
    if archive_format == "no-archive":
        tmp = Path(tempfile.mkdtemp(prefix=f".{model_name}.", suffix=".tmp", dir=export_dir))
        try:
            _write_directory(tmp, files, manifest)
            tmp.chmod(0o755)  # mkdtemp makes it private; an archive is for others to read
            _move_into_place(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    else:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{model_name}.", suffix=".tmp", dir=export_dir)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            if archive_format == "tgz":
                _write_tgz(tmp, model_name, files, manifest)
            else:
                method = (
                    zipfile.ZIP_STORED if archive_format == "zip-store" else zipfile.ZIP_DEFLATED
                )
                _write_zip(tmp, method, files, manifest)
            tmp.chmod(0o644)  # mkstemp makes it private; an archive is for others to read
            _move_into_place(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _resolve_handler(handler: str | None, files: dict[str, Path]) -> str:
    """Return the handler string to record, adding its file to ``files`` when it names one."""
    if handler is None or not handler.strip():
        raise ArchiveError(
            "No handler given: pass --handler with a built-in name such as 'image_classifier'"
            " or a file such as 'handler.py' or 'handler.py:handle'."
        )
    file_part, function = handler, ""
    head, sep, tail = handler.rpartition(":")
    if sep and head and tail.isidentifier():
        file_part, function = head, tail
    candidate = Path(file_part)
    if candidate.suffix != ".py":
        # TorchServe also accepts 'path/my_handler' for 'path/my_handler.py'.
        with_suffix = candidate.with_name(candidate.name + ".py")
        if with_suffix.is_file():
            _add(files, with_suffix.name, with_suffix)
            return candidate.name + sep + function
        if os.sep in file_part or "/" in file_part:
            raise ArchiveError(
                f"Handler file {file_part!r} not found: pass an existing .py file"
                " or a built-in handler name such as 'image_classifier'."
            )
        return handler  # a built-in handler or an importable module, recorded as is
    if not candidate.is_file():
        raise ArchiveError(
            f"Handler file {file_part!r} not found: check the --handler path"
            " (relative paths are taken from the current directory)."
        )
    _add(files, candidate.name, candidate)
    return candidate.name + sep + function


def _add_named(
    files: dict[str, Path], value: str | os.PathLike[str] | None, option: str
) -> str | None:
    """Add the file of the ``option`` argument, and return the name the manifest records;
    ``None`` when it is not given."""
    if value is None or str(value) == "":
        return None
    path = _existing_file(value, option)
    _add(files, path.name, path)
    return path.name


def _existing_file(value: str | os.PathLike[str], option: str) -> Path:
    path = Path(value)
    if not path.is_file():
        flag = "--" + option.replace("_", "-")
        raise ArchiveError(f"File {str(path)!r} given as {flag} not found: check the path.")
    return path


def _extra_files(
    extra_files: str | Iterable[str | os.PathLike[str]],
) -> Iterator[tuple[str, Path]]:
    """Yield ``(arcname, source)`` for every extra file, expanding directories."""
    entries = extra_files.split(",") if isinstance(extra_files, str) else list(extra_files)
    for entry in entries:
        text = str(entry).strip()
        if not text:
            continue
        path = Path(text)
        if path.is_file():
            yield path.name, path
        elif path.is_dir():
            for root, dirs, names in os.walk(path, followlinks=True):
                dirs[:] = sorted(
                    d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith(".")
                )
                for name in sorted(names):
                    source = Path(root) / name
                    yield source.relative_to(path).as_posix(), source
        else:
            raise ArchiveError(f"Extra file {text!r} not found: check the --extra-files list.")


def _add(files: dict[str, Path], arcname: str, source: Path) -> None:
    """Add one archive member, refusing two different sources for the same name."""
    if arcname == MANIFEST_PATH or arcname.startswith("MAR-INF/"):
        raise ArchiveError(
            f"Input {str(source)!r} would be stored as {arcname!r}, which is reserved for the"
            " manifest: rename it or leave it out."
        )
    previous = files.get(arcname)
    if previous is not None and previous.resolve() != source.resolve():
        raise ArchiveError(
            f"Two inputs would both be stored as {arcname!r}: {str(previous)!r} and"
            f" {str(source)!r}. Every file lands at the archive root by name; rename one."
        )
    files[arcname] = source


def _write_zip(tmp: Path, method: int, files: dict[str, Path], manifest: bytes) -> None:
    with zipfile.ZipFile(tmp, "w", method) as zf:
        for arcname in sorted(files):
            zf.write(files[arcname], arcname)
        zf.writestr(MANIFEST_PATH, manifest)


def _write_tgz(tmp: Path, model_name: str, files: dict[str, Path], manifest: bytes) -> None:
    with tarfile.open(tmp, "w:gz") as tf:
        for arcname in sorted(files):
            tf.add(files[arcname], arcname=f"{model_name}/{arcname}", recursive=False)
        info = tarfile.TarInfo(f"{model_name}/{MANIFEST_PATH}")
        info.size = len(manifest)
        info.mode = 0o644
        info.mtime = int(datetime.now().timestamp())
        tf.addfile(info, io.BytesIO(manifest))


def _write_directory(tmp: Path, files: dict[str, Path], manifest: bytes) -> None:
    for arcname, source in files.items():
        dest = tmp / arcname
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
    (tmp / "MAR-INF").mkdir(exist_ok=True)
    (tmp / MANIFEST_PATH).write_bytes(manifest)


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``, replacing whatever is there (a file or a directory)."""
    if not (target.exists() or target.is_symlink()):
        os.replace(tmp, target)
        return
    # os.replace cannot swap a directory for a file or a non-empty directory: move the old
    # output aside first, and put it back if the rename fails.
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    old = aside / target.name
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old, target)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    logger.warning("Replaced existing %s", target)
