"""A continuous worker's allocator keeps a step's freed memory for the next step (glibc)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

CHUNK = 48 * 2**20  # above glibc's largest dynamic mmap threshold (32 MiB): always mapped
PAGES = CHUNK // 4096
# Each round allocates the chunk and writes it (bytearray zero-fills), as a step's tensors.
PROBE = f"""
import json, resource, sys
from mservd.worker.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
bytearray({CHUNK})  # the first round faults its pages in, whatever the policy
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):
    bytearray({CHUNK})
print(json.dumps({{"kept": kept,
                   "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}}))
"""


def probe(policy: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    done = subprocess.run([sys.executable, "-c", PROBE, policy], env={**clean, **env},
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_a_step_sized_allocation_is_reused_instead_of_faulted_in_again():
    default, kept = probe("default"), probe("keep")
    assert default["faults"] >= 8 * PAGES * 0.9  # glibc maps and unmaps it every round
    assert kept["kept"] is True
    assert kept["faults"] < PAGES * 0.1


def test_an_allocator_set_by_the_environment_is_left_as_it_is():
    assert probe("keep", MALLOC_TRIM_THRESHOLD_="131072")["kept"] is False
    assert probe("keep", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")["kept"] is False
    assert probe("keep", LD_PRELOAD="")["kept"] is True  # set, but no other malloc in it

