"""blacklist_env_vars: what the daemon's children and the daemon itself show of its environment."""

from __future__ import annotations

import subprocess
import sys

from mservd.process.environment import children_environment

# PR_GET_DUMPABLE, asked in a fresh interpreter after hide_own_environment
DUMPABLE_AFTER = """
import ctypes, os
os.environ["SECRET_KEY"] = "s3cr3t"
from mservd.process.environment import hide_own_environment
hide_own_environment({hidden!r})
print(ctypes.CDLL("libc.so.6").prctl(3, 0, 0, 0, 0))
"""


def test_children_get_the_environment_less_the_names_the_pattern_matches_whole(
        monkeypatch) -> None:
    monkeypatch.setenv("SECRET_KEY", "s3cr3t")
    monkeypatch.setenv("SECRET", "kept: the name does not match all of SECRET_.*")
    seen = children_environment("SECRET_.*|AWS_.*")
    assert "SECRET_KEY" not in seen and seen["SECRET"].startswith("kept")
    assert children_environment("")["SECRET_KEY"] == "s3cr3t"


def test_the_daemon_turns_non_dumpable_only_while_it_holds_a_hidden_variable() -> None:
    def dumpable(hidden: str) -> str:
        return subprocess.run([sys.executable, "-c", DUMPABLE_AFTER.format(hidden=hidden)],
                              capture_output=True, text=True, check=True).stdout.strip()

    assert dumpable("SECRET_.*") == "0"  # its /proc files are root's: environ unreadable
    assert dumpable("NOTHING_SET_.*") == "1"
    assert dumpable("") == "1"
