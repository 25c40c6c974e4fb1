"""What an open dashboard costs: tiny at c=64 with and without a page's stream open, alternating.

    .venv/bin/python -m benchmarks.dashboard_cost [--rounds 5] [--seconds 5]

One daemon serves tiny (2 workers, batch 8, 5 ms). Each round measures a closed loop at c=64
twice, without and then with a reader on ``GET /dashboard/events`` (what an open page does:
one overview document a second), alternating which goes first from round to round. The report
gives the median throughput and p99 of each with their spread, the ratio with/without, and the
load average before each run. The target (issue 20): throughput with the page open within 3 %.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path
from typing import Self

from benchmarks import loadgen, rounds
from benchmarks.scenarios import workload_for
from benchmarks.systems import Mservd
from benchmarks.workloads import build_workloads


class PageReader:
    """An open page's stream, read by ``curl`` in its own process (a reader thread in this one
    would take the load generator's CPU and be counted as the server's cost)."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url = url
        self.out = folder / "events.txt"
        self.proc: subprocess.Popen | None = None

    @property
    def documents(self) -> int:
        return self.out.read_bytes().count(b"\n\n")  # each event ends with a blank line

    def __enter__(self) -> Self:
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(["curl", "-sN", self.url], stdout=out,
                                         stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(timeout=5)


def main(argv: list[str] | None = None) -> int:
    args = rounds.arguments(__doc__.splitlines()[0]).parse_args(argv)

    loadgen.install_fast_loop()
    store = args.store.resolve()
    system = Mservd(store, 2, 8, 5)
    system.start(["tiny"])
    runs: dict[str, list[dict[str, float]]] = {"closed": [], "open": []}
    try:
        wl = workload_for(system, build_workloads(store, 8)["tiny"])
        loadgen.closed_loop(wl, 8, 2.0)  # warm-up
        events_url = system.management_url + "/dashboard/events"
        for n in range(args.rounds):
            order = ("closed", "open") if n % 2 == 0 else ("open", "closed")
            for page in order:
                load = rounds.load1()
                if page == "open":
                    with PageReader(events_url, system.workdir) as reader:
                        result = loadgen.closed_loop(wl, 64, args.seconds)
                    documents = reader.documents
                else:
                    result = loadgen.closed_loop(wl, 64, args.seconds)
                    documents = 0
                figures = {"throughput": result.throughput, "p99_ms": result.p99_ms,
                           "errors": float(sum(result.errors.values())), "load1": load,
                           "documents": float(documents)}
                runs[page].append(figures)
                print(f"round {n + 1} page {page}: " + " ".join(
                    f"{k}={v:.4g}" for k, v in figures.items()), flush=True)
    finally:
        system.stop()
        system.cleanup()

    print("\n| figure | page closed: median (min–max) | page open: median (min–max) | open/closed |"
          "\n|---|---|---|---|")
    for key in ("throughput", "p99_ms"):
        closed = [r[key] for r in runs["closed"]]
        opened = [r[key] for r in runs["open"]]
        ratio = statistics.median(opened) / statistics.median(closed)
        print(f"| tiny c=64 {key} | {rounds.spread(closed)} | {rounds.spread(opened)} | "
              f"{ratio:.3f} |")
    loads = [r["load1"] for r in runs["closed"] + runs["open"]]
    print(f"\nload average (1 min) before the runs: {min(loads):.2f}–{max(loads):.2f}; "
          f"documents read per open run: {[int(r['documents']) for r in runs['open']]}")
    path = rounds.save(args.out, "dashboard-cost", runs)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
