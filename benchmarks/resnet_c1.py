"""resnet18 at c=1: two checkouts of mservd and the naive Flask route, rotated on the same minutes.

    .venv/bin/python -m benchmarks.resnet_c1 --a /tmp/mservd-old --b . [--rounds 6]

The suite's resnet18 c=1 target (at least the naive route's throughput) is decided by a few
per cent either way: both run the same model one request at a time, ~40 ms each. This checks it
on its own: each round starts A, B and the naive route in a rotated order, each with both
sample models as the suite does, warms resnet18 up at c=8 and measures it at c=1. The report is
each side's median throughput with its spread, and the ratios within a round.
"""

from __future__ import annotations

import json
import statistics
import sys

from benchmarks import loadgen, rounds
from benchmarks.frontends_ab import Checkout
from benchmarks.run import TARGETS
from benchmarks.scenarios import workload_for
from benchmarks.systems import NaiveFlask
from benchmarks.workloads import build_workloads


def main(argv: list[str] | None = None) -> int:
    parser = rounds.ab_arguments(__doc__.splitlines()[0], rounds=6, seconds=8.0)
    args = parser.parse_args(argv)

    loadgen.install_fast_loop()
    store = args.store.resolve()
    work = build_workloads(store, 8)["resnet18"]
    sides = {"A": lambda: Checkout(args.a.resolve(), "A", store, 2, 8, 5),
             "B": lambda: Checkout(args.b.resolve(), "B", store, 2, 8, 5),
             "naive": lambda: NaiveFlask(store, 2, 8, 5)}
    names = list(sides)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for n in range(args.rounds):
        for name in names[n % 3:] + names[:n % 3]:
            system = sides[name]()
            if name != "naive":  # as the suite starts it
                system.properties = {"models": json.dumps(TARGETS)}
            load = rounds.load1()
            system.start(["tiny", "resnet18"])
            try:
                wl = workload_for(system, work)
                loadgen.closed_loop(wl, 8, 3.0)
                c1 = loadgen.closed_loop(wl, 1, args.seconds)
            finally:
                system.stop()
                system.cleanup()
            runs[name].append({"thr": c1.throughput, "p50_ms": c1.p50_ms, "load1": load})
            print(f"round {n + 1} {name}: load {load:.2f} {c1.throughput:.1f} req/s, "
                  f"p50 {c1.p50_ms:.1f} ms", flush=True)

    print("\n| side | req/s median (min–max) | p50 ms |\n|---|---|---|")
    for name in names:
        print(f"| {name} | {rounds.spread([r['thr'] for r in runs[name]], 3)} | "
              f"{statistics.median(r['p50_ms'] for r in runs[name]):.1f} |")
    for a, b in (("B", "naive"), ("A", "naive"), ("B", "A")):
        ratios = [x["thr"] / y["thr"] for x, y in zip(runs[a], runs[b])]
        print(f"{a}/{b}: {rounds.spread(ratios, 3)}, {a} ahead in "
              f"{sum(r >= 1 for r in ratios)} of {len(ratios)} rounds")
    loads = [r["load1"] for side in runs.values() for r in side]
    print(f"\nload average (1 min) before the runs: {min(loads):.2f}–{max(loads):.2f}")
    saved = rounds.save(args.out, "resnet-c1", {"a": str(args.a), "b": str(args.b), "runs": runs})
    print(f"results: {saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
