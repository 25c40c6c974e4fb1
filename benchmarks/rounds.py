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

import psutil

from benchmarks.systems import REPO

RESULTS = REPO / "benchmarks" / "results"
FOREIGN_LIMIT = 0.25  # cores other processes may use during a run before it is invalid


def arguments(description: str, rounds: int = 5, seconds: float = 5.0) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--seconds", type=float, default=seconds, help="per measured run")
    parser.add_argument("--store", type=Path, default=REPO / "model_store")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser


def ab_arguments(description: str, rounds: int = 5,
                 seconds: float = 5.0) -> argparse.ArgumentParser:
    """:func:`arguments`, with the two checkouts an A/B compares."""
    parser = arguments(description, rounds, seconds)
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", type=Path, default=REPO, help="checkout B (the change)")
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


def save_ab(out: Path, stem: str, a: Path, b: Path,
            runs: dict[str, list[dict[str, Any]]]) -> None:
    """An A/B run's closing lines: the load averages its runs began at, and where its raw
    runs (each with its ``load1``) are saved."""
    loads = [r["load1"] for r in runs["A"] + runs["B"]]
    print(f"\nload average (1 min) before the runs: {min(loads):.2f}–{max(loads):.2f}")
    print(f"results: {save(out, stem, {'a': str(a), 'b': str(b), 'runs': runs})}")


class ForeignCpu:
    """The CPU other processes (not this benchmark, not the system measured) use during a run:
    a run during which they took more than FOREIGN_LIMIT cores is marked invalid."""

    def __init__(self) -> None:
        self.load1 = load1()
        self.started = time.monotonic()
        self.before = self.times()

    @staticmethod
    def times() -> dict[int, float]:
        out = {}
        for proc in psutil.process_iter():
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            out[proc.pid] = t.user + t.system
        return out

    def report(self, ours: set[int]) -> dict[str, Any]:
        """``load1_before``, ``foreign_cores`` during the run, and whether the run is ``valid``."""
        wall = time.monotonic() - self.started
        used = sum(t - self.before.get(pid, 0.0) for pid, t in self.times().items()
                   if pid not in ours)
        cores = used / wall if wall > 0 else 0.0
        return {"load1_before": round(self.load1, 2), "foreign_cores": round(cores, 3),
                "valid": cores <= FOREIGN_LIMIT}
