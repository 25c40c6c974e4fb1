"""Where an open overload's time and CPU go in mservd: issue 18's tiny open-loop targets taken
apart, served as the suite serves them (2 workers, batch 8, delay 5 ms, queue 100, tiny's
``maxLatencyMs`` 100, no token auth, the servers at nice 10 below the client).

    .venv/bin/python -m benchmarks.overload_anatomy [--rounds 3] [--seconds 5]
        [--factor 0.9 --factor 1.8] [--set job_queue_size=40 ...]

Each round starts mservd, runs a closed loop at c=64 (the throughput the open loops are scaled
to, as in the suite) and then each open loop (Poisson arrivals, 512 connections). Per loop:

- **CPU per request** in each process role, its ZeroMQ I/O threads apart from the rest of it,
  and the load generator's own (this process): µs per right answer at c=64, per request that
  reached the server (answered or refused) in an open loop;
- **where the time went**: the client's latency of answers and of refusals beside the part the
  HTTP frontend saw, from reading a request to writing its answer (its access log); the rest
  is the request waiting to be read and the answer waiting to be read back, i.e. waiting for
  a core;
- **where refusals were made**: at a frontend's door, as soon as the request was parsed (the
  access log names no request id), or by the controller;
- **the ceiling** of right answers at that offered rate if a refusal cost the server nothing:
  the cores left beside the load generator's CPU in that loop, divided by the server's CPU per
  answer at c=64 (as a share of c=64's throughput). The suite's 1.8x target asks for 90 %.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil

from benchmarks import loadgen, rounds
from benchmarks.loadgen import percentile
from benchmarks.run import TARGETS
from benchmarks.scenarios import Plan, workload_for
from benchmarks.systems import Mservd
from benchmarks.workloads import build_workloads

POOL = Plan().open_pool  # the open loop's connections, as in the suite
FLUSHED = 0.5  # seconds after which a frontend has written its buffered access-log lines


def thread_cpu(system: Mservd) -> dict[str, float]:
    """CPU seconds (user + system) by ``role`` and ``role (ZeroMQ I/O)`` over the system's
    live processes' threads."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = defaultdict(float)
    for proc in system.processes():
        try:
            role = system.role(proc)
            tasks = os.listdir(f"/proc/{proc.pid}/task")
        except (OSError, psutil.Error):  # gone meanwhile
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{proc.pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{proc.pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            key = f"{role} (ZeroMQ I/O)" if name.startswith("ZMQbg") else role
            out[key] += (int(fields[11]) + int(fields[12])) / tick
    return dict(out)


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def access_lines(path: Path, offset: int) -> list[tuple[int, float, bool]]:
    """(status, ms inside the frontend, refused at the door) per access-log line past
    ``offset``."""
    out = []
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f.read().decode(errors="replace").splitlines():
            parts = raw.split()
            if len(parts) < 3 or not parts[-2].endswith("us"):
                continue
            try:
                out.append((int(parts[-3]), int(parts[-2][:-2]) / 1000.0, parts[-1] == "-"))
            except ValueError:
                continue
    return out


def measured(system: Mservd, run: loadgen.Result, cpu_before: dict[str, float], client_before: float,
             log_offset: int) -> dict[str, Any]:
    """One loop's figures (see the module) from its result and the counters before it."""
    time.sleep(FLUSHED)
    cpu_after, client = thread_cpu(system), self_cpu() - client_before
    lines = access_lines(system.log_dir / "access_log.log", log_offset)
    handled = run.completed + sum(n for k, n in run.errors.items() if k.isdigit())
    per = max(1, run.completed if run.mode == "closed" else handled)
    cpu = {k: 1e6 * (v - cpu_before.get(k, 0.0)) / per for k, v in cpu_after.items()}
    cpu["load generator"] = 1e6 * client / per
    answers = sorted(ms for status, ms, _ in lines if status < 300)
    refusals = sorted(ms for status, ms, _ in lines if status == 503)
    return {
        "offered": run.rate, "answered_rps": run.throughput, "sent": run.sent,
        "completed": run.completed,
        "refused": run.errors.get("503", 0), "backlog": run.backlog, "wall": run.seconds,
        "client_cpu_s": client,
        "server_cpu_s": sum(v - cpu_before.get(k, 0.0) for k, v in cpu_after.items()),
        "us_per_request": {k: v for k, v in cpu.items() if v >= 0.5},
        "answer_p50_ms": run.p50_ms, "answer_p99_ms": run.p99_ms,
        "refusal_p99_ms": run.error_p99_ms,
        "frontend_answer_p50_ms": percentile(answers, 50),
        "frontend_answer_p99_ms": percentile(answers, 99),
        "frontend_refusal_p99_ms": percentile(refusals, 99),
        "door_refusals": sum(1 for status, _, door in lines if status == 503 and door),
    }


def one_round(store: Path, factors: list[float], seconds: float,
              settings: dict[str, str]) -> dict[str, Any]:
    work = build_workloads(store, 8)["tiny"]
    system = Mservd(store, 2, 8, 5)
    system.properties = {"models": json.dumps(TARGETS), **settings}
    foreign = rounds.ForeignCpu()
    out: dict[str, Any] = {"load1_before": foreign.load1}
    try:
        system.start(["tiny"])
        wl = workload_for(system, work)
        loadgen.closed_loop(wl, 8, 2.0)  # warm up
        time.sleep(FLUSHED)  # its access-log lines written before the first offset is taken
        log = system.log_dir / "access_log.log"

        def counters() -> tuple[dict[str, float], float, int]:
            return thread_cpu(system), self_cpu(), log.stat().st_size if log.exists() else 0

        before = counters()
        c64 = loadgen.closed_loop(wl, 64, seconds)
        out["c64"] = measured(system, c64, *before)
        print(f"  {c64.line()}", flush=True)
        for factor in factors:
            before = counters()
            run = loadgen.open_loop(wl, c64.throughput * factor, seconds, pool=POOL)
            out[str(factor)] = got = measured(system, run, *before)
            per_answer = out["c64"]["server_cpu_s"] / max(1, c64.completed)
            room = len(os.sched_getaffinity(0)) * run.seconds - got["client_cpu_s"]
            got["ceiling_share"] = room / per_answer / run.seconds / c64.throughput
            got["answered_share"] = run.throughput / c64.throughput
            print(f"  {run.line()}", flush=True)
    finally:
        out["machine"] = foreign.report({os.getpid(), *system.pids()})
        system.stop()
        system.cleanup()
    return out


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def spread(values: list[float]) -> str:
    """``median (min–max)``; a NaN (nothing of that kind in a round) is left out."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "–"
    return (f"{_number(statistics.median(values))} "
            f"({_number(min(values))}–{_number(max(values))})")


def report(runs: list[dict[str, Any]], factors: list[float]) -> list[str]:
    """Markdown: each figure's median (range) over the valid rounds."""
    valid = [r for r in runs if r["machine"]["valid"]]
    lines = [f"{len(valid)} of {len(runs)} rounds valid (load average before each: "
             + ", ".join(str(r["load1_before"]) for r in runs) + ").", ""]
    if not valid:
        return lines
    loops = ["c64", *map(str, factors)]
    lines += ["| figure | " + " | ".join("c=64" if k == "c64" else f"open {k}x"
                                         for k in loops) + " |",
              "|---|" + "---|" * len(loops)]

    def row(name: str, pick) -> None:
        lines.append(f"| {name} | " + " | ".join(
            spread([pick(r[k]) for r in valid]) if all(k in r for r in valid) else "–"
            for k in loops) + " |")

    row("right answers (req/s)", lambda g: g["answered_rps"])
    row("refused (% of sent)", lambda g: 100.0 * g["refused"] / max(1, g["sent"]))
    row("never sent: all connections busy", lambda g: g["backlog"])
    row("answers p50 / client (ms)", lambda g: g["answer_p50_ms"])
    row("answers p50 / inside the frontend (ms)", lambda g: g["frontend_answer_p50_ms"])
    row("answers p99 / client (ms)", lambda g: g["answer_p99_ms"])
    row("answers p99 / inside the frontend (ms)", lambda g: g["frontend_answer_p99_ms"])
    row("refusals p99 / client (ms)", lambda g: g["refusal_p99_ms"] or float("nan"))
    row("refusals p99 / inside the frontend (ms)", lambda g: g["frontend_refusal_p99_ms"])
    row("refusals made at a frontend's door (%)",
        lambda g: 100.0 * g["door_refusals"] / g["refused"] if g["refused"] else float("nan"))
    roles = sorted({k for r in valid for g in r.values() if isinstance(g, dict)
                    for k in g.get("us_per_request", {})})
    for role in roles:
        row(f"CPU µs per request: {role}", lambda g, role=role: g["us_per_request"].get(role, 0.0))
    row("CPU µs per request: all", lambda g: sum(g["us_per_request"].values()))
    row("server CPU µs per right answer (refusals' cost included)",
        lambda g: 1e6 * g["server_cpu_s"] / max(1, g["completed"]))
    row("answers if refusals cost the server nothing (% of c=64)",
        lambda g: 100.0 * g.get("ceiling_share", float("nan")))
    row("right answers (% of c=64)", lambda g: 100.0 * g.get("answered_share", 1.0))
    return lines


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main(argv: list[str] | None = None) -> int:
    parser = rounds.arguments(__doc__.splitlines()[0], rounds=3, seconds=5.0)
    parser.add_argument("--factor", type=float, action="append",
                        help="open loop at this multiple of c=64's throughput (repeatable; "
                             "default 0.9 and 1.8)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        type=_setting, help="a config.properties setting for mservd (repeatable)")
    args = parser.parse_args(argv)
    factors = args.factor or [0.9, 1.8]
    settings = dict(args.set)
    loadgen.install_fast_loop()
    runs = []
    for n in range(args.rounds):
        print(f"round {n + 1} of {args.rounds}", flush=True)
        runs.append(one_round(args.store.resolve(), factors, args.seconds, settings))
    lines = report(runs, factors)
    print("\n" + "\n".join(lines))
    path = rounds.save(args.out, "overload-anatomy", {"settings": settings, "runs": runs})
    print(f"\nraw runs: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
