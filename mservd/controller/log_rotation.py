"""Logs that cannot fill the disk: each file in the log folder is kept under ``log_max_bytes``,
with ``log_backup_count`` older copies beside it (``access_log.log.1`` the newest), as
TorchServe's log4j2 keeps five of 100 MB. Every request, a stranger's 401 too, writes an
access-log line: unbounded, a client could fill the disk by asking.

The writers are other processes (the frontends, the workers), holding the files open in append
mode, so a full file is copied aside and emptied in place (logrotate's ``copytruncate``): each
writer's next line lands at the start of the emptied file. A line written between the copy and
the emptying is lost; that is the price of rotating files other processes hold open.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

log = logging.getLogger(__name__)

ROTATED_SUFFIXES = (".log", ".out")  # mservd.log, access_log.log, model_<name>.log, mservd.out
CHECK_INTERVAL = 5.0  # seconds between looks at the files' sizes


def rotate_full_logs(log_dir: Path, max_bytes: int, backups: int) -> list[str]:
    """Rotate every log in ``log_dir`` (not its subfolders) larger than ``max_bytes``; the
    names of those rotated."""
    rotated = []
    for path in sorted(log_dir.iterdir()):
        if not path.name.endswith(ROTATED_SUFFIXES) or path.is_symlink():
            continue
        try:
            if not path.is_file() or path.stat().st_size <= max_bytes:
                continue
            rotate(path, backups)
        except OSError as exc:
            log.warning("could not rotate %s: %s", path, exc)
            continue
        rotated.append(path.name)
    return rotated


def rotate(path: Path, backups: int) -> None:
    """``path`` becomes ``path.1`` (``path.1`` becomes ``path.2``, …, the oldest dropped) and
    ``path`` is emptied, with its writers still holding it open."""
    if backups > 0:
        for number in range(backups - 1, 0, -1):
            older = path.with_name(f"{path.name}.{number}")
            if older.exists():
                older.replace(path.with_name(f"{path.name}.{number + 1}"))
        shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    os.truncate(path, 0)


class LogRotation:
    """A thread of the daemon that looks at the log files every ``CHECK_INTERVAL`` seconds."""

    def __init__(self, log_dir: Path, max_bytes: int, backups: int) -> None:
        self.log_dir, self.max_bytes, self.backups = log_dir, max_bytes, backups
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-rotation", daemon=True)

    def start(self) -> None:
        if self.max_bytes > 0:  # 0: logs grow without bound (rotated by the system, say)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=CHECK_INTERVAL)

    def _run(self) -> None:
        while not self._stop.wait(CHECK_INTERVAL):
            for name in rotate_full_logs(self.log_dir, self.max_bytes, self.backups):
                log.info("rotated %s: it was over log_max_bytes (%d)", name, self.max_bytes)
