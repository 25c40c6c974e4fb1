"""Model archives (``.mar``): TorchServe's format, written and safely read.

The package owns the archive format only; the daemon imports :func:`unpack` and
:func:`read_manifest` and the name rules in :mod:`archiver.manifest`, and the
``model-archiver`` command lives in :mod:`archiver.cli`.
"""

from __future__ import annotations

from archiver.errors import ArchiveError, UnsafeArchiveError
from archiver.manifest import Manifest
from archiver.reader import UnpackLimits, read_manifest, unpack
from archiver.writer import write_archive

__all__ = [
    "ArchiveError",
    "Manifest",
    "UnpackLimits",
    "UnsafeArchiveError",
    "__version__",
    "read_manifest",
    "unpack",
    "write_archive",
]

#: Recorded as ``archiverVersion`` in every manifest we write.
__version__ = "0.1.0"
