"""Whether issue 18's tiny open 1.8x target fits in this machine's cores at all: its CPU budget,
from the costs of an answer, of a refusal and of the load generator, each measured alone.

    .venv/bin/python -m benchmarks.overload_budget [--rounds 3] [--seconds 5]

Each round starts mservd twice, as the suite serves tiny (2 workers, batch 8, delay 5 ms, queue
100, ``maxLatencyMs`` 100, the servers at nice 10 below the client):

1. a closed loop at c=64, every request answered: its throughput ``T``, the server's CPU per
   answer ``a`` and the load generator's per request ``g``;
2. with every prediction refused at its frontend's door (``door_shut/sitecustomize.py``), an
   open loop at 1.8 ``T`` (Poisson arrivals, 512 connections): the server's CPU per refusal
   ``r`` and the load generator's per request ``g2``.

At c=64 the cores are busy: ``T (a + g)`` is about all of them. The target asks, at 1.8 ``T``
offered, for 0.9 ``T`` right answers, so at least ``T (0.9 a + 0.9 r + 1.8 g2)`` cores: answers
at c=64's cost, every refusal the cheapest kind there is (at the door: none crosses to the
controller), and the client's cost per request that of a refusal (an answer's is larger). If
that is more than the machine has, no admission rule meets the target here; a latency target
(accepted p99 < 100 ms) also needs room to spare below it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import loadgen, rounds
from benchmarks.overload_anatomy import FLUSHED, POOL, self_cpu, spread, thread_cpu
from benchmarks.run import TARGETS
from benchmarks.scenarios import workload_for
from benchmarks.systems import Mservd
from benchmarks.workloads import build_workloads

DOOR_SHUT = Path(__file__).resolve().parent / "door_shut"
FACTOR, ANSWERED = 1.8, 0.9  # the target: at 1.8x c=64's throughput, 90 % of it answered


def serve(store: Path, work: Any, shut: bool, loop) -> dict[str, Any]:
    """One mservd, warmed up, and one loop on it: CPU per request of the server and client."""
    saved = {k: os.environ.get(k) for k in ("MSERVD_BENCH_DOOR_SHUT", "PYTHONPATH")}
    if shut:
        os.environ["MSERVD_BENCH_DOOR_SHUT"] = "1"
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(DOOR_SHUT), saved["PYTHONPATH"]) if p)
    system = Mservd(store, 2, 8, 5)
    system.properties = {"models": json.dumps(TARGETS)}
    foreign = rounds.ForeignCpu()
    try:
        system.start(["tiny"])
        wl = workload_for(system, work)
        loadgen.closed_loop(wl, 8, 2.0)  # warm up
        time.sleep(FLUSHED)
        server_before, client_before = thread_cpu(system), self_cpu()
        run = loop(wl)
        time.sleep(FLUSHED)
        server_after, client = thread_cpu(system), self_cpu() - client_before
        handled = run.completed + sum(n for k, n in run.errors.items() if k.isdigit())
        server = sum(v - server_before.get(k, 0.0) for k, v in server_after.items())
        return {"rps": handled / run.seconds, "completed": run.completed,
                "refused": run.errors.get("503", 0), "errors": dict(run.errors),
                "backlog": run.backlog, "server_us": 1e6 * server / max(1, handled),
                "client_us": 1e6 * client / max(1, handled), "wall": run.seconds,
                "machine": foreign.report({os.getpid(), *system.pids()})}
    finally:
        system.stop()
        system.cleanup()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def one_round(store: Path, seconds: float) -> dict[str, Any]:
    work = build_workloads(store, 8)["tiny"]
    load1 = rounds.load1()
    answered = serve(store, work, False, lambda wl: loadgen.closed_loop(wl, 64, seconds))
    rate = FACTOR * answered["rps"]
    refused = serve(store, work, True,
                    lambda wl: loadgen.open_loop(wl, rate, seconds, pool=POOL))
    t, a, g = answered["rps"], answered["server_us"], answered["client_us"]
    r, g2 = refused["server_us"], refused["client_us"]
    cores = len(os.sched_getaffinity(0))
    return {"load1_before": round(load1, 2), "answered": answered, "refused": refused,
            "cores": cores, "busy_c64": t * (a + g) / 1e6,
            "needed": t * (ANSWERED * a + ANSWERED * r + FACTOR * g2) / 1e6,
            "valid": answered["machine"]["valid"] and refused["machine"]["valid"]
            and not refused["completed"]}


def report(runs: list[dict[str, Any]]) -> list[str]:
    valid = [r for r in runs if r["valid"]]
    lines = [f"{len(valid)} of {len(runs)} rounds valid (load average before each: "
             + ", ".join(str(r["load1_before"]) for r in runs) + ").", ""]
    if not valid:
        return lines

    def row(name: str, pick) -> None:
        lines.append(f"| {name} | {spread([pick(r) for r in valid])} |")

    lines += ["| figure | median (min–max) |", "|---|---|"]
    row("c=64: right answers T (req/s)", lambda r: r["answered"]["rps"])
    row("c=64: server CPU per answer a (µs)", lambda r: r["answered"]["server_us"])
    row("c=64: load generator's CPU per request g (µs)", lambda r: r["answered"]["client_us"])
    row("c=64: cores busy, T (a + g)", lambda r: r["busy_c64"])
    row("door shut, open 1.8 T: refusals (req/s)", lambda r: r["refused"]["rps"])
    row("door shut: server CPU per refusal r (µs)", lambda r: r["refused"]["server_us"])
    row("door shut: load generator's CPU per request g2 (µs)",
        lambda r: r["refused"]["client_us"])
    row("cores the target needs at least, T (0.9 a + 0.9 r + 1.8 g2)", lambda r: r["needed"])
    row("cores the machine has", lambda r: r["cores"])
    row("the least it needs, % of the machine", lambda r: 100.0 * r["needed"] / r["cores"])
    return lines


def main(argv: list[str] | None = None) -> int:
    args = rounds.arguments(__doc__.splitlines()[0], rounds=3, seconds=5.0).parse_args(argv)
    loadgen.install_fast_loop()
    runs = []
    for n in range(args.rounds):
        print(f"round {n + 1} of {args.rounds}", flush=True)
        runs.append(got := one_round(args.store.resolve(), args.seconds))
        print(f"  T {got['answered']['rps']:,.0f}/s, a {got['answered']['server_us']:.0f} µs, "
              f"r {got['refused']['server_us']:.0f} µs; needs {got['needed']:.2f} of "
              f"{got['cores']} cores"
              + (f" (invalid: the door let {got['refused']['completed']} in)"
                 if got["refused"]["completed"] else ""), flush=True)
    lines = report(runs)
    print("\n" + "\n".join(lines))
    path = rounds.save(args.out, "overload-budget", {"runs": runs})
    print(f"\nraw runs: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
