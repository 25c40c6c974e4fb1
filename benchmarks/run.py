"""Run the benchmark suite: mservd, TorchServe and the naive Flask baseline in alternating rounds.

    .venv/bin/python -m benchmarks.run [--quick] [--out benchmarks/results] [--systems ...]
    make bench

Each round runs every system in turn, in a rotated order (A B C, B C A, C A B, ...); a run
during which other processes used the machine is marked invalid and left out. The report gives
each figure's median over the valid rounds and each ratio's median with its range.
Writes ``<out>/results-<stamp>.json`` (and ``<out>/latest.json``), then renders BENCHMARKS.md and
benchmarks/latency_throughput.png from it (``--no-report`` skips that; ``--render FILE`` only
renders an earlier result). ``--quick`` is a short smoke run of a subset of the scenarios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import loadgen
from benchmarks.report import medians
from benchmarks.scenarios import Plan, client_ceiling, run_memory, run_system
from benchmarks.systems import (
    REPO,
    Mservd,
    NaiveFlask,
    TorchServe,
    torchserve_available,
    torchserve_version,
)
from benchmarks.workloads import build_workloads, inprocess_limit

SYSTEMS = ("mservd", "torchserve", "naive-flask")
# mservd's per-model latency targets (maxLatencyMs): TorchServe has no such setting
TARGETS = {"tiny": {"1.0": {"maxLatencyMs": 100}}}


def machine() -> dict[str, Any]:
    import torch

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    except OSError:
        pass
    ts = torchserve_version()  # in its own environment
    return {"cpus": os.cpu_count(), "cpu": cpu, "memory": mem, "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "torchserve": ts, "platform": platform.platform(),
            "loadavg_at_start": os.getloadavg()}


def _limit_seconds(model: str, quick: bool) -> float:
    """How long the in-process limit of ``model`` is measured."""
    return 2.0 if quick else (4.0 if model == "tiny" else 8.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short subset (smoke test)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--store", type=Path, default=REPO / "model_store")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-batch-delay", type=int, default=5, help="milliseconds")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of all systems in turn (each round another order); "
                             "figures are the medians over the valid rounds")
    parser.add_argument("--no-report", action="store_true")
    parser.add_argument("--render", type=Path, help="only render this results JSON")
    args = parser.parse_args(argv)

    if args.render:
        from benchmarks.report import render

        results = json.loads(args.render.read_text())
        if results.get("rounds"):  # the medians as report.py takes them now
            results["systems"].update(medians(results["rounds"]))
        render(results, REPO)
        return 0

    loop_name = loadgen.install_fast_loop()
    plan = Plan.quick() if args.quick else Plan()
    store = args.store.resolve()
    for name in ("tiny", "resnet18"):
        if not (store / f"{name}.mar").exists():
            print(f"{store}/{name}.mar is missing: run `make samples` first", file=sys.stderr)
            return 2
    started = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {msg}", flush=True)

    results: dict[str, Any] = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "quick": args.quick, "machine": machine(), "event_loop": loop_name,
        "settings": {"workers_per_model": args.workers, "batch_size": args.batch_size,
                     "max_batch_delay_ms": args.max_batch_delay, "job_queue_size": 100,
                     "mservd_latency_targets": TARGETS,
                     "plan": plan.__dict__},
        "systems": {},
    }
    log(f"machine: {results['machine']}")
    works = build_workloads(store, args.batch_size)

    log("client ceiling against benchmarks/trivial_server.py")
    results["client_ceiling"] = client_ceiling(2.0 if args.quick else 4.0)
    for key, r in results["client_ceiling"].items():
        log(f"  {key}: {r['throughput']:.0f} req/s, p99 {r['p99_ms']:.2f} ms")

    log("in-process limit (the handler on full batches, no server)")
    results["inprocess"] = {}
    for name, work in works.items():
        results["inprocess"][name] = inprocess_limit(store / f"{name}.mar", work,
                                                     args.batch_size,
                                                     _limit_seconds(name, args.quick))
        log(f"  {name}: {results['inprocess'][name]['throughput']:.1f} req/s "
            f"(batch {args.batch_size}, {results['inprocess'][name]['threads']} threads)")

    wanted = [s for s in args.systems.split(",") if s]
    classes = {}
    for name in wanted:
        if name == "torchserve":
            why = torchserve_available()
            if why:
                results["systems"][name] = {"system": name, "skipped": why}
                log(f"torchserve skipped: {why}")
                continue
            classes[name] = TorchServe
        elif name == "mservd":
            classes[name] = Mservd
        elif name == "naive-flask":
            classes[name] = NaiveFlask
        else:
            raise SystemExit(f"unknown system {name!r}: use {', '.join(SYSTEMS)}")
    rounds = 1 if args.quick else max(1, args.rounds)
    results["rounds"] = []
    names = list(classes)
    for n in range(rounds):
        order = names[n % len(names):] + names[:n % len(names)]  # A B C, B C A, C A B, ...
        this_round: dict[str, Any] = {}
        for name in order:
            system = classes[name](store, args.workers, args.batch_size, args.max_batch_delay)
            if isinstance(system, Mservd):  # tiny's latency target, for the 1.8x open loop
                system.properties = {"models": json.dumps(TARGETS)}
            log(f"round {n + 1} of {rounds}: {name}")
            limits = None
            if isinstance(system, Mservd):  # its resnet18 c=64 is judged against the limit
                limits = {"resnet18": functools.partial(
                    inprocess_limit, store / "resnet18.mar", works["resnet18"],
                    args.batch_size, _limit_seconds("resnet18", args.quick))}
            entry = run_system(system, works, plan, log, limits)
            if n == 0 and plan.memory_workers and name != "naive-flask":
                log(f"  {name}: memory with {plan.memory_workers} workers of {plan.memory_model}")
                entry["memory_workers"] = run_memory(system, works, plan, log)
            system.cleanup()
            this_round[name] = entry
        results["rounds"].append(this_round)
    results["systems"].update(medians(results["rounds"]))

    results["total_seconds"] = round(time.time() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.out / f"results-{stamp}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(results, indent=1))
    (args.out / "latest.json").write_text(json.dumps(results, indent=1))
    log(f"results: {path}")
    if not args.no_report:
        from benchmarks.report import render

        for out in render(results, REPO):
            log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
