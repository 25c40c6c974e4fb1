"""Profile mservd's hot path at tiny c=64: CPU per process, and py-spy stacks of each process.

    .venv/bin/python -m benchmarks.profile_hotpath [--seconds 15] [--rate 3500]
        [--out benchmarks/results/profile]

Starts mservd (2 workers, batch 8, delay 5 ms) with ``tiny`` only, drives closed-loop c=64 (or,
with ``--rate``, an open loop at that many requests a second) from a separate load-generator
process, and meanwhile runs ``py-spy record`` (pip install py-spy)
on every mservd process. Writes one collapsed-stack file and one SVG per process and prints,
per process role, the CPU it used and its top functions by own (leaf) samples and by inclusive
samples.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.systems import REPO, Mservd


def summarize(collapsed: Path, top: int = 12) -> tuple[int, list, list]:
    leaf: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        leaf[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    return total, leaf.most_common(top), incl.most_common(top * 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rate", type=float, help="an open loop at this many requests/s "
                        "instead of the closed loop")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "profile")
    args = parser.parse_args(argv)
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    args.out.mkdir(parents=True, exist_ok=True)
    system = Mservd((REPO / "model_store").resolve(), 2, 8, 5)
    try:
        system.start(["tiny"])
        body = json.dumps([0.25] * 64)
        url = f"{system.inference_url}/predictions/tiny"
        subprocess.run([sys.executable, "-m", "benchmarks.loadgen", url, "-c", "8", "--seconds",
                        "2", "--body", body], cwd=REPO, check=True, capture_output=True)
        procs = {p.pid: system.role(p) for p in system.processes()}
        before = system.cpu_times()
        loop = (["--rate", str(args.rate), "-c", "512"] if args.rate  # the suite's pool
                else ["-c", str(args.concurrency)])
        load = subprocess.Popen([sys.executable, "-m", "benchmarks.loadgen", url, *loop,
                                 "--seconds", str(args.seconds + 2), "--body", body],
                                cwd=REPO, stdout=subprocess.PIPE, text=True)
        import psutil

        load_ps = psutil.Process(load.pid)
        time.sleep(1.0)
        spies = []
        for pid, role in procs.items():
            stem = args.out / f"{role.replace(' ', '_')}-{pid}"
            for fmt, suffix in (("raw", ".txt"), ("flamegraph", ".svg")):
                spies.append(subprocess.Popen(
                    [pyspy, "record", "--pid", str(pid), "--duration", str(int(args.seconds)),
                     "--rate", "200", "--nonblocking", "--format", fmt, "-o",
                     str(stem) + suffix], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for spy in spies:
            spy.wait()
        after = system.cpu_times()
        lt = load_ps.cpu_times()
        out, _ = load.communicate()
        print(out.strip())
        print(f"load generator: {lt.user + lt.system:.1f} CPU s over the whole run")
        for pid, role in procs.items():
            used = after.get(pid, (role, 0))[1] - before.get(pid, (role, 0))[1]
            stem = args.out / f"{role.replace(' ', '_')}-{pid}.txt"
            print(f"\n== {role} (pid {pid}): {used:.1f} CPU s during the profile window")
            if not stem.exists():
                print("   (no py-spy output)")
                continue
            total, leaf, incl = summarize(stem)
            print(f"   {total} samples; top own time:")
            for name, n in leaf:
                print(f"   {100 * n / total:5.1f}%  {name}")
            print("   top inclusive:")
            for name, n in incl:
                print(f"   {100 * n / total:5.1f}%  {name}")
    finally:
        system.stop()
        system.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
