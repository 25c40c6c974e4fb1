"""Two builds of the SmolLM2 sample under the same streaming clients, interleaved: short prompts
and mixed-length prompts, on the same minutes.

    .venv/bin/python -m benchmarks.generation_ab --a STORE_A --b STORE_B [--rounds 3]
        [--seconds 20] [--streams 16]

For comparing two generation engines (the handler an archive carries): ``STORE_A`` and
``STORE_B`` are model stores holding a ``smollm2.mar`` each, served in turn by this checkout's
daemon. Each of ``--streams`` clients sends ``POST /predictions/smollm2`` requests back to back,
streamed, EOS ignored, and reads the parts as they come; a request still streaming when the
window closes is dropped by its client (the server cancels it), so every window ends on time.
The workloads (one seeded request list each, the same for A and B):

- ``short``: an 8-word prompt, ``max_tokens`` 16–128;
- ``mixed``: a prompt of 8–384 words, ``max_tokens`` 16–128.

Per (build, workload): tokens/s in the window (a request that ended inside it counts its
``max_tokens``, one cut by the window the parts it got), time to first part p50/p99 and the gap
between parts p50/p99, with the load average before each window. Each figure is the median over
the rounds, its range beside it; the builds alternate, their order reversed every other round.
Results: ``benchmarks/results/generation-ab-<time>.json`` and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.generation import RESULTS, closed_loop
from benchmarks.generation import streamed as client
from benchmarks.systems import Mservd

WORDS = ("the", "city", "river", "old", "music", "light", "garden", "stone", "window", "story",
         "people", "morning", "water", "history", "mountain", "friend", "market", "winter",
         "letter", "bridge", "road", "school", "paper", "house")
WORKLOADS = {"short": (8, 8), "mixed": (8, 384)}  # prompt words, low and high
TOKENS = (16, 128)  # max_tokens, low and high
REQUESTS = 4096  # each workload's seeded request list, taken in turn by the clients


def requests_for(workload: str, seed: int = 7) -> list[dict[str, Any]]:
    """The workload's requests, the same for every build and round."""
    rng = random.Random(f"{workload}-{seed}")
    low, high = WORKLOADS[workload]
    out = []
    for _ in range(REQUESTS):
        words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
        out.append({"prompt": " ".join(words), "max_tokens": rng.randint(*TOKENS),
                    "ignore_eos": True})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="model store A (the baseline)")
    parser.add_argument("--b", type=Path, required=True, help="model store B (the change)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--streams", type=int, default=16)
    args = parser.parse_args(argv)
    work = {name: requests_for(name) for name in WORKLOADS}
    runs: dict[str, dict[str, list[dict]]] = {"A": {w: [] for w in WORKLOADS},
                                              "B": {w: [] for w in WORKLOADS}}
    for n in range(args.rounds):
        sides = (("A", args.a), ("B", args.b))
        for label, store in sides if n % 2 == 0 else sides[::-1]:
            system = Mservd(store.resolve(), 1, 16, 5, 1000)
            system.start(["smollm2"])
            try:
                url = system.inference_url
                warm = client(url, [{"prompt": "Hello", "max_tokens": 8, "ignore_eos": True}])
                closed_loop(2, 3.0, warm)
                for workload in WORKLOADS:
                    figures = closed_loop(args.streams, args.seconds, client(url, work[workload]))
                    runs[label][workload].append(figures)
                    print(f"round {n + 1} {label} {workload}: " + " ".join(
                        f"{k}={v:.3g}" for k, v in figures.items()), flush=True)
            finally:
                system.stop()
                system.cleanup()
    keys = (("tokens_per_s", "tokens/s"), ("ttft_p50_ms", "first part p50 ms"),
            ("ttft_p99_ms", "first part p99 ms"), ("itl_p50_ms", "gap p50 ms"),
            ("itl_p99_ms", "gap p99 ms"), ("errors", "errors"), ("load1", "load average"))
    print("\n| workload | figure | A median (min–max) | B median (min–max) | B/A |")
    print("|---|---|---|---|---|")
    for workload in WORKLOADS:
        for key, label in keys:
            a = [r[key] for r in runs["A"][workload]]
            b = [r[key] for r in runs["B"][workload]]
            ma, mb = statistics.median(a), statistics.median(b)
            ratio = f"{mb / ma:.2f}" if ma else "-"
            print(f"| {workload} | {label} | {ma:.4g} ({min(a):.4g}–{max(a):.4g}) | "
                  f"{mb:.4g} ({min(b):.4g}–{max(b):.4g}) | {ratio} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"generation-ab-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"a": str(args.a), "b": str(args.b), "seconds": args.seconds,
                               "streams": args.streams, "runs": runs}, indent=1))
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
