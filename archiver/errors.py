"""Errors raised by the archiver.

Owns the two exception types every archiver module raises. A message says what failed, quotes
the offending value with ``!r`` and says how to fix it, so the CLI and the daemon can show it
as is. Nothing here exits or logs; callers decide what an error means for them.
"""

from __future__ import annotations

__all__ = ["ArchiveError", "UnsafeArchiveError"]


class ArchiveError(Exception):
    """An archive could not be written or read: bad input, missing file, corrupt archive."""


class UnsafeArchiveError(ArchiveError):
    """An archive was refused because unpacking it could harm the host.

    Raised for entries that escape the target directory, links, device files and archives
    whose size or file count passes :class:`archiver.reader.UnpackLimits`. It subclasses
    :class:`ArchiveError` so a caller that only reports failures needs one ``except``.
    """
