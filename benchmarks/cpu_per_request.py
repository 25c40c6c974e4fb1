"""CPU per request in each mservd process on the hot path (tiny, 2 workers, batch 8).

    .venv/bin/python -m benchmarks.cpu_per_request [--rounds 3] [--seconds 6] [--tree DIR ...]
        [--models tiny,resnet18] [--concurrency 64]

For each tree (a checkout of mservd; default: this one) in alternating rounds, starts mservd
serving ``--models`` (default ``tiny``, the one measured), drives a closed loop on tiny at
concurrency 64 and then 1 from a separate load-generator process, and divides the CPU seconds
each process used (user + system, from /proc) by the right answers it took part in. Reports
per tree, concurrency and role the median over the rounds with the range, the throughput and
the p50. Issue 18 asks that the per-request cost of each hop nearly vanish: this is the
before/after table (``--tree OLD_CHECKOUT --tree .``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.rounds import ForeignCpu
from benchmarks.systems import REPO, Mservd
from benchmarks.workloads import tiny_bodies

ROLES = ("http frontend", "controller", "worker tiny")


def measure(tree: Path, concurrency: int, seconds: float,
            models: list[str]) -> dict[str, Any]:
    """One run of one tree: CPU µs per right answer per role, req/s and p50."""
    os.environ["PYTHONPATH"] = str(tree)  # the daemon's children import mservd from the tree
    system = Mservd((REPO / "model_store").resolve(), 2, 8, 5)
    try:
        system.start(models)  # tiny is measured; the others are served, idle
        url = f"{system.inference_url}/predictions/tiny"
        body = tiny_bodies()[0].decode()
        loadgen = [sys.executable, "-m", "benchmarks.loadgen", url, "--body", body, "--json"]
        client_env = {**os.environ, "PYTHONPATH": str(REPO)}  # this tree's load generator
        subprocess.run([*loadgen, "-c", str(concurrency), "--seconds", "1.5"], cwd=REPO,
                       env=client_env, check=True, capture_output=True)  # warm up
        ours = {p.pid for p in system.processes()}
        foreign = ForeignCpu()
        before = system.cpu_times()
        client = subprocess.Popen([*loadgen, "-c", str(concurrency), "--seconds", str(seconds)],
                                  cwd=REPO, env=client_env, stdout=subprocess.PIPE, text=True)
        stdout, _ = client.communicate()
        after = system.cpu_times()
        ours |= {p.pid for p in system.processes()} | {os.getpid(), client.pid}
        machine = foreign.report(ours)
    finally:
        system.stop()
        system.cleanup()
    result = json.loads(stdout.strip().splitlines()[-1])
    done = max(1, result["completed"])
    cpu: dict[str, float] = {}
    for pid, (role, used) in after.items():
        spent = used - before.get(pid, (role, used))[1]
        cpu[role] = cpu.get(role, 0.0) + spent
    return {"rps": result["throughput"], "p50_ms": result["p50_ms"], "completed": done,
            "other_cores": machine["foreign_cores"], "valid": machine["valid"],
            "us_per_request": {r: 1e6 * cpu.get(r, 0.0) / done
                                                     for r in sorted(cpu)}}


def median_range(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, action="append",
                        help="a checkout of mservd to measure (repeat for A/B; default: this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--concurrency", type=int, action="append",
                        help="closed-loop concurrency (repeatable; default 64 and 1)")
    parser.add_argument("--models", default="tiny",
                        help="models served (tiny is the one measured), e.g. tiny,resnet18")
    args = parser.parse_args(argv)
    trees = [t.resolve() for t in (args.tree or [REPO])]
    levels = args.concurrency or [64, 1]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rnd in range(args.rounds):
        order = trees if rnd % 2 == 0 else trees[::-1]
        for tree in order:
            for c in levels:
                load = os.getloadavg()[0]
                got = measure(tree, c, args.seconds, args.models.split(","))
                got["load_before"] = load
                runs.setdefault((str(tree), c), []).append(got)
                print(f"round {rnd + 1} {tree.name} c={c}: {got['rps']:.0f} req/s, p50 "
                      f"{got['p50_ms']:.2f} ms, load {load:.2f}, other {got['other_cores']:.2f} "
                      "cores, µs/request " + ", ".join(
                          f"{r} {v:.0f}" for r, v in got["us_per_request"].items()), flush=True)
    print()
    print("| tree | c | " + " | ".join(f"{r} µs/req" for r in ROLES)
          + " | all µs/req | req/s | p50 ms |")
    print("|---|---|" + "---|" * (len(ROLES) + 3))
    for (tree, c), got in runs.items():
        valid = [g for g in got if g["valid"]]
        if not valid:
            print(f"| {Path(tree).name} | {c} | no valid run: other processes were busy |")
            continue
        cells = [median_range([g["us_per_request"].get(r, 0.0) for g in valid]) for r in ROLES]
        total = median_range([sum(g["us_per_request"].values()) for g in valid])
        print(f"| {Path(tree).name} | {c} | " + " | ".join(cells) + f" | {total} | "
              f"{median_range([g['rps'] for g in valid])} | "
              f"{statistics.median(g['p50_ms'] for g in valid):.2f} |")
    out = REPO / "benchmarks" / "results" / f"cpu-per-request-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({f"{t}|{c}": g for (t, c), g in runs.items()}, indent=1))
    print(f"\nraw runs: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
