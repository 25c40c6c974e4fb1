"""What every benchmark of alternating rounds shares: its options, the machine's load before a
run, each figure's median with its spread, and where the results are kept.

Numbers on a shared two-core machine move ±15 % from minute to minute, so the systems (or
settings) compared run in turns — A, B, A, B, … — and a figure is the median over its rounds,
shown with the lowest and highest round so that a reader sees how much it moved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.systems import REPO

RESULTS = REPO / "benchmarks" / "results"


def arguments(description: str, rounds: int = 5, seconds: float = 5.0) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--seconds", type=float, default=seconds, help="per measured run")
    parser.add_argument("--store", type=Path, default=REPO / "model_store")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser


def load1() -> float:
    """The one-minute load average now, recorded before each run."""
    return os.getloadavg()[0]


def spread(values: list[float], digits: int = 4) -> str:
    """``median (min–max)``."""
    return (f"{statistics.median(values):.{digits}g} "
            f"({min(values):.{digits}g}–{max(values):.{digits}g})")


def save(out: Path, stem: str, document: Any) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(document, indent=1))
    return path
