"""A continuous-batching worker keeps the memory a step frees for the next step (glibc).

Every step of the paged engine allocates and frees the same large tensors in every layer: the
keys and values of each sequence gathered from the cache (7 MB each a layer for 16 sequences
of 600 tokens with SmolLM2), the attention's scores, a prompt chunk's activations. glibc's
malloc maps a chunk above its mmap threshold fresh from the kernel and unmaps it on free, and
gives back the heap's free top above its trim threshold; either way the next step faults the
pages in again, zeroed by the kernel. glibc raises both thresholds by itself, but only after
it has freed a mapped chunk, and never past 32 MiB (mallopt(3)): so whether a step faults
depends on the process's allocation history, and a step whose tensors are larger always does.
Measured on the 2-core box (``benchmarks/engine_step.py``, three rounds alternated): the
engine in a plain process faulted 440 MiB a step of 16 sequences of 600 tokens and took 641
ms a step, against 491 without faults; the daemon's worker happened not to fault.

So before its first step a continuous worker sets the two thresholds high enough that a
step's tensors come from the heap and stay there: what it keeps is what its largest step used,
which the next such step wants again (62 MiB more resident in that benchmark). A batch worker
keeps glibc's policy: its memory at rest is one of the things mservd is measured on.
Variables that set the allocator (``MALLOC_*``, ``GLIBC_TUNABLES``, or another malloc in
``LD_PRELOAD``) win: nothing is changed when the environment has one. Not glibc (musl,
macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("mservd.worker")

M_TRIM_THRESHOLD = -1  # mallopt(3)'s parameter numbers, from glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 * 2**20  # a chunk this large or larger is still mapped (the KV cache)
TRIM_THRESHOLD = 512 * 2**20  # free memory at the heap's top kept for the next step
ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
               "MALLOC_MMAP_MAX_")


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for this process; whether they were set."""
    if (any(name in os.environ for name in ENVIRONMENT)
            or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")
            or "malloc" in os.environ.get("LD_PRELOAD", "")):  # jemalloc, tcmalloc, mimalloc
        log.info("allocator left as the environment sets it")
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False  # not glibc: its allocator keeps its own policy
    done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if done:
        log.info("allocator: a step's freed memory is kept for the next (glibc mmap threshold "
                 "%d MiB, trim threshold %d MiB)", MMAP_THRESHOLD >> 20, TRIM_THRESHOLD >> 20)
    else:
        log.warning("glibc refused the allocator's thresholds: steps may fault their memory in")
    return done
