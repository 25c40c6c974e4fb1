"""resnet18 in a closed loop: two checkouts of mservd, the naive Flask route and, with
``--torchserve``, TorchServe, rotated on the same minutes.

    .venv/bin/python -m benchmarks.resnet_closed --a /tmp/mservd-old --b . [--rounds 6]
    .venv/bin/python -m benchmarks.resnet_closed --a . --concurrency 8 --torchserve

The suite's resnet18 targets at c=1 and c=8 (at least the naive route's and TorchServe's
throughput) are decided by a few per cent either way: at c=1 every system runs the same model
one request at a time, ~40 ms each; at c=8 each is near the machine's limit. This checks one
concurrency on its own: each round starts every side in a rotated order, each with both sample
models and the suite's settings, warms resnet18 up at c=8 and measures it at ``--concurrency``.
The report is each side's median throughput with its spread, and the ratios within a round.
"""

from __future__ import annotations

import json
import statistics
import sys

from benchmarks import loadgen, rounds
from benchmarks.frontends_ab import Checkout
from benchmarks.run import TARGETS
from benchmarks.scenarios import workload_for
from benchmarks.systems import NaiveFlask, TorchServe
from benchmarks.workloads import build_workloads


def main(argv: list[str] | None = None) -> int:
    parser = rounds.ab_arguments(__doc__.splitlines()[0], rounds=6, seconds=8.0)
    parser.add_argument("--concurrency", type=int, default=1, help="clients (closed loop)")
    parser.add_argument("--torchserve", action="store_true",
                        help="TorchServe too, from its own environment")
    args = parser.parse_args(argv)

    loadgen.install_fast_loop()
    store = args.store.resolve()
    work = build_workloads(store, 8)["resnet18"]
    sides = {"A": lambda: Checkout(args.a.resolve(), "A", store, 2, 8, 5),
             "B": lambda: Checkout(args.b.resolve(), "B", store, 2, 8, 5),
             "naive": lambda: NaiveFlask(store, 2, 8, 5)}
    if args.b.resolve() == args.a.resolve():  # one checkout: measured once a round
        del sides["B"]
    if args.torchserve:
        sides["torchserve"] = lambda: TorchServe(store, 2, 8, 5)
    names = list(sides)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for n in range(args.rounds):
        for name in names[n % len(names):] + names[:n % len(names)]:
            system = sides[name]()
            if name in ("A", "B"):  # as the suite starts it
                system.properties = {"models": json.dumps(TARGETS)}
            load = rounds.load1()
            system.start(["tiny", "resnet18"])
            try:
                wl = workload_for(system, work)
                loadgen.closed_loop(wl, 8, 3.0)
                run = loadgen.closed_loop(wl, args.concurrency, args.seconds)
            finally:
                system.stop()
                system.cleanup()
            runs[name].append({"thr": run.throughput, "p50_ms": run.p50_ms, "p99_ms": run.p99_ms,
                               "load1": load})
            print(f"round {n + 1} {name}: load {load:.2f} {run.throughput:.1f} req/s, "
                  f"p50 {run.p50_ms:.1f} ms, p99 {run.p99_ms:.1f} ms", flush=True)

    print("\n| side | req/s median (min–max) | p50 ms | p99 ms |\n|---|---|---|---|")
    for name in names:
        print(f"| {name} | {rounds.spread([r['thr'] for r in runs[name]], 3)} | "
              f"{statistics.median(r['p50_ms'] for r in runs[name]):.1f} | "
              f"{statistics.median(r['p99_ms'] for r in runs[name]):.1f} |")
    pairs = [("B", "naive"), ("A", "naive"), ("B", "A")]
    if args.torchserve:
        pairs += [("B", "torchserve"), ("A", "torchserve")]
    for a, b in [(a, b) for a, b in pairs if a in runs and b in runs]:
        ratios = [x["thr"] / y["thr"] for x, y in zip(runs[a], runs[b])]
        print(f"{a}/{b}: {rounds.spread(ratios, 3)}, {a} ahead in "
              f"{sum(r >= 1 for r in ratios)} of {len(ratios)} rounds")
    loads = [r["load1"] for side in runs.values() for r in side]
    print(f"\nload average (1 min) before the runs: {min(loads):.2f}–{max(loads):.2f}")
    saved = rounds.save(args.out, f"resnet-c{args.concurrency}",
                        {"a": str(args.a), "b": str(args.b), "runs": runs})
    print(f"results: {saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
