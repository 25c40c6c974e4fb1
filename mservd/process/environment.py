"""What the daemon's processes let handler code see of its environment (TorchServe's
``blacklist_env_vars``: a regular expression of variable names).

The zygote, and so every worker it forks, and the frontends start with
:func:`children_environment`: the daemon's environment less the matching variables, so not
even their ``/proc/<pid>/environ`` holds them. The daemon itself keeps them (a model's URL may
need a credential) and, while any are hidden, makes itself non-dumpable
(:func:`hide_own_environment`): its ``/proc`` files, ``environ`` among them, are then
readable by root alone, not by a handler running as the same user.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re

log = logging.getLogger("mservd")

_PR_SET_DUMPABLE = 4


def children_environment(hidden: str) -> dict[str, str]:
    """The daemon's environment less the variables whose whole name matches ``hidden``."""
    if not hidden:
        return dict(os.environ)
    pattern = re.compile(hidden)
    return {name: value for name, value in os.environ.items() if not pattern.fullmatch(name)}


def hide_own_environment(hidden: str) -> None:
    """Make this process non-dumpable when ``hidden`` names variables it holds (Linux)."""
    if not hidden or children_environment(hidden).keys() == os.environ.keys():
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")
    except OSError as exc:
        log.warning("could not make the daemon non-dumpable (%s): a process of the same "
                    "user may read its environment in /proc", exc)
