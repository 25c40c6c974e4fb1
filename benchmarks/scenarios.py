"""The benchmark scenarios, run against one system at a time.

For each system (same archives, workers, batch size and delay):

1. cold start: the command to ready with both models loaded, then the first right answer;
2. memory idle (RSS and PSS summed over the process tree);
3. for ``tiny`` and ``resnet18``: a warm-up, closed loop at concurrency 1, 8 and 64, then open
   loop (Poisson) at 0.9x and 1.8x of the best closed-loop throughput this system reached;
   during tiny@64 the CPU seconds of every process (and of the load generator) are recorded,
   and memory is sampled under load;
4. separately, memory with 1 and with 4 workers of one model (resnet18), idle and under load.

The in-process limit (:func:`benchmarks.workloads.inprocess_limit`) and the client's own
ceiling (:func:`client_ceiling`) are measured once per run; a model's limit also beside a
system's largest closed loop when the caller asks (:func:`run_model`).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

from benchmarks import loadgen
from benchmarks.loadgen import Workload
from benchmarks.rounds import ForeignCpu
from benchmarks.systems import REPO, System
from benchmarks.workloads import ModelWork


@dataclass
class Plan:
    """How long each measurement runs (seconds) and which loads to apply."""

    concurrencies: tuple[int, ...] = (1, 8, 64)
    open_factors: tuple[float, ...] = (0.9, 1.8)
    tiny_seconds: float = 5.0
    resnet_seconds: float = 8.0
    warmup_seconds: float = 3.0
    idle_seconds: float = 2.0
    memory_workers: tuple[int, ...] = (1, 4)
    memory_model: str = "resnet18"
    memory_load_seconds: float = 6.0
    open_pool: int = 512
    timeout: float = 30.0

    @classmethod
    def quick(cls) -> Plan:
        return cls(concurrencies=(1, 64), open_factors=(1.8,), tiny_seconds=2.0,
                   resnet_seconds=3.0, warmup_seconds=1.0, idle_seconds=0.5,
                   memory_workers=(), memory_load_seconds=2.0, open_pool=128)


def client_ceiling(seconds: float, concurrency: int = 64) -> dict[str, Any]:
    """The load generator against benchmarks/trivial_server.py: the most it can measure."""
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.trivial_server"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline().split()[1])  # type: ignore[union-attr]
        work = Workload.post("trivial", f"http://127.0.0.1:{port}/predictions/trivial",
                             [b"[0.5]"], "application/json", loadgen.check_equals(b"[0.0]"))
        out = {}
        for c in (1, concurrency):
            out[f"c{c}"] = loadgen.closed_loop(work, c, seconds).as_dict()
        return out
    finally:
        proc.terminate()
        proc.wait(10)


class MemorySampler:
    """Samples the system's memory every ``every`` seconds in a thread; keeps the peak.

    Sparingly: reading a process's smaps_rollup makes the kernel walk its page tables (5-25 ms
    for a worker that maps torch), holding its memory map, and a sample every second stalled
    the server it measures (tiny c=64 latency spikes of ~100 ms)."""

    def __init__(self, system: System, every: float = 2.5) -> None:
        self.system = system
        self.every = every
        self.peak: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            mem = self.system.memory()
            if self.peak is None or mem["pss_mib"] > self.peak["pss_mib"]:
                self.peak = mem

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _short_mem(mem: dict[str, Any] | None) -> dict[str, Any] | None:
    if mem is None:
        return None
    by_role: dict[str, dict[str, float]] = {}
    for p in mem["per_process"]:
        r = by_role.setdefault(p["role"], {"count": 0, "rss_mib": 0.0, "pss_mib": 0.0})
        r["count"] += 1
        r["rss_mib"] = round(r["rss_mib"] + p["rss_mib"], 1)
        r["pss_mib"] = round(r["pss_mib"] + p["pss_mib"], 1)
    return {"processes": mem["processes"], "rss_mib": mem["rss_mib"], "pss_mib": mem["pss_mib"],
            "by_role": by_role}


def workload_for(system: System, work: ModelWork) -> Workload:
    return Workload.post(work.name, f"{system.inference_url}/predictions/{work.name}",
                         work.bodies, work.content_type, work.check)


def first_answer_seconds(system: System, works: dict[str, ModelWork]) -> float:
    """Seconds until every model gave one right answer (after ready)."""
    t0 = time.perf_counter()
    for work in works.values():
        deadline = time.monotonic() + 60
        while True:
            r = loadgen.closed_loop(workload_for(system, work), 1, 10, max_requests=1)
            if r.completed == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    return time.perf_counter() - t0


def run_model(system: System, work: ModelWork, plan: Plan, log,
              limit: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Warm-up, the closed loops, the open loops. ``limit`` measures the model's in-process
    limit: it runs just before the largest closed loop, so that loop is judged against the
    machine's speed of the same minute (it moves ±15 % from one minute to the next)."""
    seconds = plan.tiny_seconds if work.name == "tiny" else plan.resnet_seconds
    wl = workload_for(system, work)
    out: dict[str, Any] = {"closed": {}, "open": {}}
    warm = loadgen.closed_loop(wl, 8, plan.warmup_seconds, timeout=plan.timeout)
    log(f"    warm-up  {warm.line()}")
    for c in plan.concurrencies:
        if limit is not None and c == max(plan.concurrencies):
            out["inprocess_limit"] = limit()
            log(f"    in-process limit just before: {out['inprocess_limit']['throughput']:.1f} "
                "req/s")
        measure_cpu = work.name == "tiny" and c == max(plan.concurrencies)
        before = system.cpu_times() if measure_cpu else {}
        self_before = resource.getrusage(resource.RUSAGE_SELF)
        with MemorySampler(system) as sampler:
            r = loadgen.closed_loop(wl, c, seconds, timeout=plan.timeout)
        entry = r.as_dict()
        entry["memory_peak"] = _short_mem(sampler.peak)
        if measure_cpu:
            entry["cpu"] = _cpu_breakdown(before, system.cpu_times(), self_before, r.seconds)
        out["closed"][str(c)] = entry
        log(f"    {r.line()}")
        if r.first_error:
            log(f"      first error: {r.first_error[:300]}")
    best = max(v["throughput"] for v in out["closed"].values())
    out["max_throughput"] = best
    for f in plan.open_factors:
        rate = max(best * f, 0.5)
        r = loadgen.open_loop(wl, rate, seconds, pool=plan.open_pool, timeout=plan.timeout)
        entry = r.as_dict()
        entry["factor"] = f
        out["open"][str(f)] = entry
        log(f"    {r.line()}")
        if r.first_error:
            log(f"      first error: {r.first_error[:300]}")
    return out


def _cpu_breakdown(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                   self_before: Any, wall: float) -> dict[str, Any]:
    roles: dict[str, float] = {}
    for pid, (role, t) in after.items():
        used = t - before.get(pid, (role, 0.0))[1]
        roles[role] = roles.get(role, 0.0) + used
    me = resource.getrusage(resource.RUSAGE_SELF)
    roles["load generator"] = (me.ru_utime + me.ru_stime) - (self_before.ru_utime
                                                             + self_before.ru_stime)
    return {"wall_seconds": round(wall, 3),
            "cpu_seconds": {k: round(v, 2) for k, v in sorted(roles.items())},
            "cores_busy": round(sum(roles.values()) / wall, 2) if wall else None}


def run_system(system: System, works: dict[str, ModelWork], plan: Plan, log,
               limits: dict[str, Callable[[], dict[str, Any]]] | None = None) -> dict[str, Any]:
    """All scenarios of one system with both models (``limits``: per model, what measures its
    in-process limit beside this run, see :func:`run_model`); the system is stopped at the
    end."""
    out: dict[str, Any] = {"system": system.name}
    foreign = ForeignCpu()
    try:
        ready = system.start(list(works))
        out["ready_seconds"] = round(ready, 2)
        out["first_answers_seconds"] = round(first_answer_seconds(system, works), 2)
        log(f"  {system.name}: ready in {ready:.2f} s, first answers +"
            f"{out['first_answers_seconds']:.2f} s")
        time.sleep(plan.idle_seconds)
        out["memory_idle"] = _short_mem(system.memory())
        log(f"    idle memory: RSS {out['memory_idle']['rss_mib']:.0f} MiB, "
            f"PSS {out['memory_idle']['pss_mib']:.0f} MiB in {out['memory_idle']['processes']} "
            "processes")
        for name, work in works.items():
            out[name] = run_model(system, work, plan, log, (limits or {}).get(name))
    except Exception as exc:  # one system failing must not end the run
        out["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        log(f"  ! {system.name} failed: {out['error'][:2000]}")
    finally:
        out["machine"] = foreign.report({os.getpid(), *system.pids()})
        system.stop()
    log(f"  {system.name}: load average before {out['machine']['load1_before']}, other "
        f"processes used {out['machine']['foreign_cores']} cores during the run"
        + ("" if out["machine"]["valid"] else " -> INVALID (a busy machine)"))
    return out


def run_memory(system: System, works: dict[str, ModelWork], plan: Plan, log) -> dict[str, Any]:
    """Memory with ``plan.memory_workers`` workers of one model, idle and under load."""
    out: dict[str, Any] = {}
    work = works[plan.memory_model]
    base_workers = system.workers
    for n in plan.memory_workers:
        system.workers = n
        try:
            ready = system.start([work.name])
            first_answer_seconds(system, {work.name: work})
            time.sleep(plan.idle_seconds)
            idle = system.memory()
            with MemorySampler(system, 0.5) as sampler:
                r = loadgen.closed_loop(workload_for(system, work), 8, plan.memory_load_seconds,
                                        timeout=plan.timeout)
            out[str(n)] = {"ready_seconds": round(ready, 2), "idle": _short_mem(idle),
                           "load": _short_mem(sampler.peak), "load_result": r.as_dict()}
            log(f"    {system.name} {n} x {work.name}: idle RSS {idle['rss_mib']:.0f} / PSS "
                f"{idle['pss_mib']:.0f} MiB; under load PSS "
                f"{(sampler.peak or idle)['pss_mib']:.0f} MiB ({r.completed} ok, "
                f"errors {r.errors})")
        except Exception as exc:  # one count failing must not end the sweep
            out[str(n)] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            log(f"  ! {system.name} memory with {n} workers failed: {out[str(n)]['error'][:500]}")
        finally:
            system.stop()
    system.workers = base_workers
    return out
