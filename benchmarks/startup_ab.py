"""Two checkouts of mservd started in turn, A, B, A, B, …: ready time, CPU to ready, idle PSS.

    .venv/bin/python -m benchmarks.startup_ab --a /tmp/mservd-old --b . [--rounds 6]

Each start is the suite's cold start (``benchmarks.scenarios``): tiny and resnet18, two workers
each, from the command to the state file. Then the CPU seconds each process role used up to
ready (the zygote's import of torch is the critical path; everything else shares the cores with
it) and, after ``--seconds`` idle, the PSS summed over the process tree. The report gives each
figure's median per checkout, its spread, and in how many rounds B came out lower than A.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from benchmarks import rounds
from benchmarks.frontends_ab import Checkout

MODELS = ["tiny", "resnet18"]


def one_start(system: Checkout, idle: float) -> dict[str, Any]:
    ready = system.start(MODELS)
    try:
        cpu: dict[str, float] = {}
        for role, seconds in system.cpu_times().values():
            cpu[role] = cpu.get(role, 0.0) + seconds
        time.sleep(idle)
        pss = system.memory()["pss_mib"]
    finally:
        system.stop()
    return {"ready_s": ready, "pss_mib": pss, "cpu_s": sum(cpu.values()),
            "cpu_by_role": {role: round(s, 2) for role, s in sorted(cpu.items())}}


def main(argv: list[str] | None = None) -> int:
    parser = rounds.ab_arguments(__doc__.splitlines()[0], rounds=6, seconds=2.0)
    args = parser.parse_args(argv)

    store = args.store.resolve()
    runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    for n in range(args.rounds):
        sides = (("A", args.a), ("B", args.b))
        for label, tree in sides if n % 2 == 0 else sides[::-1]:  # neither always runs first
            system = Checkout(tree.resolve(), label, store, 2, 8, 5)
            load = rounds.load1()
            figures = one_start(system, args.seconds)
            figures["load1"] = load
            runs[label].append(figures)
            system.cleanup()
            print(f"round {n + 1} {label}: load {load:.2f} ready {figures['ready_s']:.2f} s, "
                  f"PSS {figures['pss_mib']:.0f} MiB, CPU to ready "
                  + " ".join(f"{r}={s}" for r, s in figures["cpu_by_role"].items()), flush=True)

    print("\n| figure | A median (min–max) | B median (min–max) | rounds B lower |\n"
          "|---|---|---|---|")
    for key, label in (("ready_s", "ready (s)"), ("cpu_s", "CPU to ready, all processes (s)"),
                       ("pss_mib", "idle PSS (MiB)")):
        a = [r[key] for r in runs["A"]]
        b = [r[key] for r in runs["B"]]
        lower = sum(y < x for x, y in zip(a, b))
        print(f"| {label} | {rounds.spread(a, 3)} | {rounds.spread(b, 3)} | "
              f"{lower} of {len(a)} |")
    roles = sorted({role for r in runs["A"] + runs["B"] for role in r["cpu_by_role"]})
    for role in roles:
        a = [r["cpu_by_role"].get(role, 0.0) for r in runs["A"]]
        b = [r["cpu_by_role"].get(role, 0.0) for r in runs["B"]]
        print(f"| CPU to ready: {role} (s) | {statistics.median(a):.2f} | "
              f"{statistics.median(b):.2f} | {sum(y < x for x, y in zip(a, b))} of {len(a)} |")
    rounds.save_ab(args.out, "startup-ab", args.a, args.b, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
