"""One step of the paged engine on this machine: what long contexts and prompt chunks cost, and
what glibc's allocator policy does to it.

    .venv/bin/python -m benchmarks.engine_step [--rounds 3] [--context 600] [--steps 10]
                                               [--before OLD.mar]

The smollm2 sample's engine (``handlers/paged_engine.py``) alone, no daemon, in a fresh
process for every measurement: 16 sequences prefilled to ``--context`` tokens, then
``--steps`` decoding steps timed; then steps of the same 16 with a prompt chunk of 64 and of
256 tokens beside them; then 16 sequences of 60 tokens (the short workload's size) decoding.
Two allocator policies take turns, the order reversed every other round: glibc's default, and
a continuous worker's (``mservd/worker/allocator.py``, set after the model loads, as the
worker does). With ``--before`` two engines take turns instead, both under the continuous
worker's policy and on this checkout's sample weights: the ``paged_engine.py`` inside an
archive built from an older commit ("before"), and this checkout's ("now"). Each figure is
the median over the rounds of each process's median step, with
the range; minor page faults are counted a decoding step, in MiB; the load average (1 min) is
recorded before each process; RSS is the process's at the end (two engines of a 1 GiB cache
in it). The cost of a prompt token beside decoding streams is the 256-token chunk's step less
the decoding step, over 256.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ARCHIVE = REPO / "model_store" / "smollm2.mar"
RESULTS = REPO / "benchmarks" / "results"
POLICIES = ("glibc default", "continuous worker")
ENGINE = REPO / "handlers" / "paged_engine.py"
SEQUENCES = 16
SHORT = 60
CHUNKS = (64, 256)


def measure(policy: str, context: int, steps: int, engine_file: Path = ENGINE) -> dict[str, Any]:
    """In this process: the step times (ms) of each shape, faults a decoding step, RSS, with
    the engine of ``engine_file``."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(REPO))
    from mservd.worker.allocator import keep_freed_memory

    spec = importlib.util.spec_from_file_location("paged_engine", engine_file)
    assert spec is not None and spec.loader is not None
    paged_engine = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = paged_engine  # (its dataclasses look their module up)
    spec.loader.exec_module(paged_engine)
    PagedEngine, kv_budget = paged_engine.PagedEngine, paged_engine.kv_budget

    with tempfile.TemporaryDirectory(prefix="engine-step-") as folder:
        with zipfile.ZipFile(ARCHIVE) as archive:
            archive.extractall(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                     attn_implementation="sdpa").eval()
    if policy == "continuous worker":
        assert keep_freed_memory(), "glibc refused the thresholds, or the environment set them"

    def tokens(seed: int, n: int) -> list[int]:
        return [100 + (seed * 7 + j * 13) % 5000 for j in range(n)]

    def engine(length: int) -> Any:
        made = PagedEngine(model, kv_budget(model, "1GiB", torch.device("cpu")), 512,
                           lambda rid, logits: int(torch.argmax(logits)), False, 64)
        for i in range(SEQUENCES):
            made.add(f"s{i}", tokens(i, length), 10_000, eos=[])
        while sum(state.status == made.DECODING for state in
                  made.processor.scheduler.active_requests.values()) < SEQUENCES:
            made.step()
        for _ in range(3):
            made.step()
        return made

    def timed(made: Any, n: int, chunk: int = 0) -> tuple[float, float]:
        """Median ms of ``n`` steps (each beside a new prompt of ``chunk`` tokens); faults."""
        made.step_tokens = lambda decoding, prompts: decoding + chunk
        times, faults = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for i in range(n):
            if chunk:
                made.add(f"p{chunk}-{i}", tokens(1000 + i, chunk), 1, eos=[])
            started = time.perf_counter()
            ran = made.step()
            times.append((time.perf_counter() - started) * 1000)
            assert sum(ran.scheduled.values()) == SEQUENCES + chunk, ran.scheduled
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        return statistics.median(times), faults * 4096 / 2**20 / n

    long = engine(context)
    figures: dict[str, Any] = {}
    figures["decode"], figures["faults_mib"] = timed(long, steps)
    for chunk in CHUNKS:
        figures[f"chunk {chunk}"] = timed(long, max(3, steps // 2), chunk)[0]
    del long
    figures["decode short"] = timed(engine(SHORT), steps)[0]
    with open("/proc/self/statm") as statm:
        figures["rss_mib"] = int(statm.read().split()[1]) * 4096 / 2**20
    return figures


def child(policy: str, context: int, steps: int, engine_file: Path = ENGINE) -> dict[str, Any]:
    """``measure`` in a fresh interpreter: its allocation history starts clean."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}  # glibc's own defaults
    done = subprocess.run([sys.executable, "-m", "benchmarks.engine_step", "--child", policy,
                           "--context", str(context), "--steps", str(steps),
                           "--engine", str(engine_file)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    if done.returncode:
        raise SystemExit(f"{policy} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=600,
                        help="tokens each of the 16 long sequences holds")
    parser.add_argument("--steps", type=int, default=10, help="decoding steps timed")
    parser.add_argument("--before", type=Path, metavar="OLD.mar",
                        help="compare the engine in this smollm2 archive with this checkout's")
    parser.add_argument("--child", choices=POLICIES, help=argparse.SUPPRESS)
    parser.add_argument("--engine", type=Path, default=ENGINE, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.context, args.steps, args.engine)))
        return
    if not ARCHIVE.exists():
        raise SystemExit("Build the sample first: make samples")
    with tempfile.TemporaryDirectory(prefix="engine-before-") as folder:
        systems = {policy: (policy, ENGINE) for policy in POLICIES}
        if args.before:
            with zipfile.ZipFile(args.before) as archive:
                before = Path(archive.extract("paged_engine.py", folder))
            systems = {"before": (POLICIES[1], before), "now": (POLICIES[1], ENGINE)}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
        loads = []
        names = list(systems)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                policy, engine_file = systems[name]
                loads.append(os.getloadavg()[0])
                runs[name].append(child(policy, args.context, args.steps, engine_file))
                print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
    print(report(runs, args.context, loads))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"engine-step-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"context": args.context, "steps": args.steps, "loads": loads,
                               "before": str(args.before) if args.before else None,
                               "runs": runs}, indent=1))
    print(f"\nresults: {out}")


def report(runs: dict[str, list[dict[str, Any]]], context: int, loads: list[float]) -> str:
    columns = [("decode", f"16 × {context} decoding (ms)"),
               ("faults_mib", "faults a step (MiB)"),
               *[(f"chunk {n}", f"+ {n}-token chunk (ms)") for n in CHUNKS],
               ("decode short", f"16 × {SHORT} decoding (ms)"), ("rss_mib", "RSS (MiB)")]
    lines = ["| system | " + " | ".join(title for _, title in columns)
             + " | prompt token (ms) |", "|---" * (len(columns) + 2) + "|"]
    for policy, rows in runs.items():
        cells = []
        for key, _ in columns:
            values = [row[key] for row in rows]
            cells.append(f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})")
        token = [(row[f"chunk {CHUNKS[-1]}"] - row["decode"]) / CHUNKS[-1] for row in rows]
        cells.append(f"{statistics.median(token):.2f} ({min(token):.2f}–{max(token):.2f})")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    lines.append(f"\nmedians over {len(next(iter(runs.values())))} rounds (min–max); load "
                 f"average (1 min) before the processes {min(loads):.1f}–{max(loads):.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
