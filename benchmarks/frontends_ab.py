"""Two checkouts of mservd on the tiny model, interleaved: A, B, A, B, … on the same minutes.

    .venv/bin/python -m benchmarks.frontends_ab --a /tmp/mservd-old --b . [--rounds 4]
        [--open 0.9 --open 1.8] [--latency-target-ms 100]

For comparing one change to the serving path (the HTTP frontends moving onto gunicorn, first):
each round starts each checkout in turn (``python -m mservd`` with that checkout first on
``PYTHONPATH``, so its daemon, zygote and frontends all run its code), warms it up, and measures
tiny closed loop at c=1 and c=64, then open loops at 1.8x (or the ``--open`` factors) that
round's own c=64 throughput; ``--latency-target-ms`` gives tiny the suite's ``maxLatencyMs``. The
report is the median of each figure per checkout, its spread (min–max), and B/A, with the load
average before each run. Both run in this environment: what a checkout needs must be installed
here (the older frontend needed httptools).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import loadgen, rounds
from benchmarks.scenarios import workload_for
from benchmarks.systems import Mservd
from benchmarks.workloads import build_workloads

FIGURES = (  # (key, label): closed loops; each open loop adds OPEN_FIGURES
    ("c1_p50_ms", "tiny c=1 p50 ms"),
    ("c1_thr", "tiny c=1 req/s"),
    ("c64_thr", "tiny c=64 req/s"),
    ("c64_p99_ms", "tiny c=64 p99 ms"),
)
OPEN_FIGURES = (  # (key, label), each for one factor
    ("ok", "answered/s"),
    ("p99_ms", "accepted p99 ms"),
    ("refused", "refused share"),
    ("refusal_p99_ms", "refusals p99 ms"),
)


def open_key(factor: float, key: str) -> str:
    """A figure's key for the open loop at ``factor``: 1.8 keeps the tool's first names."""
    return f"open_{key}" if factor == 1.8 else f"open{factor:g}_{key}"


class Checkout(Mservd):
    """mservd as one checkout's code runs it."""

    def __init__(self, tree: Path, label: str, *args: Any) -> None:
        self.tree, self.label = tree, label
        super().__init__(*args)

    def command(self, models: list[str]) -> tuple[list[str], dict[str, str]]:
        cmd, env = super().command(models)
        env = {**env, "PYTHONPATH": str(self.tree)}
        return cmd, env


def one_run(system: Checkout, work, seconds: float,
            factors: list[float]) -> dict[str, float]:
    system.start(["tiny"])
    try:
        wl = workload_for(system, work)
        loadgen.closed_loop(wl, 8, 2.0)  # warm-up
        c1 = loadgen.closed_loop(wl, 1, seconds)
        c64 = loadgen.closed_loop(wl, 64, seconds)
        figures = {"c1_p50_ms": c1.p50_ms, "c1_thr": c1.throughput,
                   "c64_thr": c64.throughput, "c64_p99_ms": c64.p99_ms}
        for factor in factors:
            rate = factor * c64.throughput
            opened = loadgen.open_loop(wl, rate, seconds, pool=512)
            refused = sum(v for k, v in opened.errors.items() if k == "503")
            figures.update({open_key(factor, "ok"): opened.completed / opened.seconds,
                            open_key(factor, "p99_ms"): opened.p99_ms,
                            open_key(factor, "refused"): refused / max(opened.sent, 1),
                            open_key(factor, "refusal_p99_ms"): opened.error_p99_ms,
                            open_key(factor, "rate"): rate})
    finally:
        system.stop()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = rounds.ab_arguments(__doc__.splitlines()[0], rounds=4)
    parser.add_argument("--open", type=float, action="append", dest="factors",
                        help="an open loop at this factor of c=64's throughput (repeatable; "
                             "default 1.8)")
    parser.add_argument("--latency-target-ms", type=int,
                        help="tiny's maxLatencyMs, as the suite sets it (default: none)")
    args = parser.parse_args(argv)
    factors = args.factors or [1.8]

    loadgen.install_fast_loop()
    store = args.store.resolve()
    work = build_workloads(store, 8)["tiny"]
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for n in range(args.rounds):
        sides = (("A", args.a), ("B", args.b))
        for label, tree in sides if n % 2 == 0 else sides[::-1]:  # neither always runs first
            system = Checkout(tree.resolve(), label, store, 2, 8, 5)
            if args.latency_target_ms:
                system.properties = {"models": json.dumps(
                    {"tiny": {"1.0": {"maxLatencyMs": args.latency_target_ms}}})}
            load = rounds.load1()
            figures = one_run(system, work, args.seconds, factors)
            figures["load1"] = load
            runs[label].append(figures)
            system.cleanup()
            print(f"round {n + 1} {label}: load {load:.2f} " + " ".join(
                f"{k}={v:.3g}" for k, v in figures.items()), flush=True)

    print("\n| figure | A median (min–max) | B median (min–max) | B/A |\n|---|---|---|---|")
    shown = list(FIGURES) + [(open_key(f, key), f"tiny open {f:g}x {label}")
                             for f in factors for key, label in OPEN_FIGURES]
    for key, label in shown:
        a = [r[key] for r in runs["A"]]
        b = [r[key] for r in runs["B"]]
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = f"{mb / ma:.2f}" if ma else "-"
        print(f"| {label} | {rounds.spread(a, 3)} | {rounds.spread(b, 3)} | {ratio} |")
    rounds.save_ab(args.out, "frontends-ab", args.a, args.b, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
