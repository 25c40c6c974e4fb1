"""Build every sample archive into ``model_store/`` (or another folder), skipping up-to-date ones.

    .venv/bin/python samples/build_all.py [--force] [--export-path DIR] [NAME ...]

An archive is up to date when it is newer than every file it is made of (each sample's
``sources()``); another folder reuses an up-to-date archive of ``model_store/`` instead of
building it again. The samples' ``build.py`` files are loaded by path, so this works from a fresh
clone without ``samples`` being importable, and tests can reuse :func:`build_samples`.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
MODEL_STORE = HERE.parent / "model_store"
#: In build order: cheapest first, so a broken environment shows up fast.
SAMPLES = ("tiny", "digits", "resnet18", "minilm", "smollm2")

logger = logging.getLogger("samples.build_all")


def load_build_module(name: str) -> ModuleType:
    """The ``samples/<name>/build.py`` module, loaded by path under a private name."""
    if name not in SAMPLES:
        raise ValueError(f"Unknown sample {name!r}: use one of {', '.join(SAMPLES)}.")
    spec = importlib.util.spec_from_file_location(f"_sample_build_{name}", HERE / name / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def is_up_to_date(archive: Path, sources: tuple[Path, ...]) -> bool:
    if not archive.is_file():
        return False
    built = archive.stat().st_mtime
    return all(source.stat().st_mtime <= built for source in sources)


def build_samples(
    export_path: str | Path = MODEL_STORE,
    names: tuple[str, ...] | list[str] = SAMPLES,
    force: bool = False,
) -> dict[str, Path]:
    """Build the named samples into ``export_path`` and return each one's archive path."""
    export = Path(export_path)
    export.mkdir(parents=True, exist_ok=True)
    archives: dict[str, Path] = {}
    for name in names:
        module = load_build_module(name)
        archive = export / f"{module.NAME}.mar"
        built = MODEL_STORE / archive.name  # what `make samples` made, reused by a test store
        if not force and is_up_to_date(archive, module.sources()):
            logger.info("%s: up to date (%s)", name, archive)
        elif not force and built != archive and is_up_to_date(built, module.sources()):
            archive.unlink(missing_ok=True)
            try:
                os.link(built, archive)  # the same file: nothing is copied
            except OSError:  # another file system
                shutil.copy2(built, archive)
            logger.info("%s: reused %s as %s", name, built, archive)
        else:
            started = time.perf_counter()
            archive = module.build(export)
            logger.info("%s: built %s in %.1f s", name, archive, time.perf_counter() - started)
        archives[name] = archive
    return archives


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"samples to build (default: all of {', '.join(SAMPLES)})",
    )
    parser.add_argument(
        "--export-path",
        type=Path,
        default=MODEL_STORE,
        help="where to write the archives (default: model_store/)",
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild even when an archive is up to date"
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in SAMPLES]
    if unknown:
        parser.error(f"unknown sample(s) {', '.join(map(repr, unknown))}: use {', '.join(SAMPLES)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    build_samples(args.export_path, args.names or SAMPLES, force=args.force)


if __name__ == "__main__":
    main()
