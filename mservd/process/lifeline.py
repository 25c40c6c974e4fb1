"""Tying a child process's life to the daemon's, so no process outlives it.

Workers and the frontend server call :func:`die_with_parent` first thing: when the daemon
exits, even by SIGKILL, Linux sends the child ``signal``. Callers that poll also compare
:func:`parent_changed` as a fallback for systems without the parent-death signal.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1

#: A worker's exit code when its model cannot load: the supervisor then backs off or gives up.
EXIT_LOAD_FAILED = 3


def die_with_parent(sig: int = signal.SIGKILL) -> int:
    """Ask for ``sig`` when the parent exits; returns the parent's pid at the time of asking."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig))
    except OSError:
        pass  # not glibc Linux: parent_changed() still lets a polling loop notice
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)
    return parent


def parent_changed(parent: int) -> bool:
    return os.getppid() != parent
