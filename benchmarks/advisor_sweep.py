"""Does the batching advisor choose well? A sweep of fixed batch sizes against batchSize: auto.

    .venv/bin/python -m benchmarks.advisor_sweep [--models tiny,resnet18] [--rounds 3]

For each model, mservd serves it with 2 workers and a 5 ms batch delay at each fixed batch size
of 1, 2, 4, 8, 16 and 32, and once with ``batchSize: auto`` and the model's latency target
(``maxLatencyMs``, given in a ``models=`` block), each measured as a closed loop at c=64 after a
warm-up long enough for the advisor to size batches. The configurations alternate within each
round. The best of the sweep is the highest median throughput among the sizes whose median p99
is within the target (or the highest of all, if none is); the advisor passes when its median
throughput is at least 90 % of that (issue 18).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import urllib.request

from benchmarks import loadgen, rounds
from benchmarks.scenarios import workload_for
from benchmarks.systems import Mservd
from benchmarks.workloads import build_workloads

SIZES = (1, 2, 4, 8, 16, 32)
TARGET_MS = {"tiny": 50, "resnet18": 2000}
WARM_UP = {"tiny": 3.0, "resnet18": 15.0}  # seconds at c=64: >= SIZE_EVERY batches for auto


def one_run(store, work, model: str, size: int | str, seconds: float) -> dict[str, float]:
    system = Mservd(store, 2, 8 if size == "auto" else size, 5)
    if size == "auto":
        system.properties = {"models": json.dumps({model: {"1.0": {
            "batchSize": "auto", "maxLatencyMs": TARGET_MS[model]}}})}
    system.start([model])
    try:
        wl = workload_for(system, work)
        loadgen.closed_loop(wl, 64, WARM_UP[model])
        result = loadgen.closed_loop(wl, 64, seconds)
        chosen = float(size) if size != "auto" else describe(system, model)["batchSizeNow"]
    finally:
        system.stop()
        system.cleanup()
    return {"throughput": result.throughput, "p99_ms": result.p99_ms, "batch": chosen,
            "errors": float(sum(result.errors.values()))}


def describe(system: Mservd, model: str) -> dict:
    with urllib.request.urlopen(f"{system.management_url}/models/{model}", timeout=10) as r:
        return json.loads(r.read())[0]


def main(argv: list[str] | None = None) -> int:
    parser = rounds.arguments(__doc__.splitlines()[0], rounds=3, seconds=6.0)
    parser.add_argument("--models", default="tiny,resnet18")
    args = parser.parse_args(argv)
    loadgen.install_fast_loop()
    store = args.store.resolve()
    works = build_workloads(store, 8)
    configs: list[int | str] = [*SIZES, "auto"]
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    for model in args.models.split(","):
        runs[model] = {str(c): [] for c in configs}
        for n in range(args.rounds):
            order = configs if n % 2 == 0 else configs[::-1]
            for config in order:
                load = rounds.load1()
                figures = {**one_run(store, works[model], model, config, args.seconds),
                           "load1": load}
                runs[model][str(config)].append(figures)
                print(f"{model} round {n + 1} batch {config}: " + " ".join(
                    f"{k}={v:.4g}" for k, v in figures.items()), flush=True)

    verdicts = {}
    for model, by_config in runs.items():
        target = TARGET_MS[model]
        print(f"\n{model}, latency target {target} ms, closed loop c=64, 2 workers:\n"
              "| batch | throughput req/s | p99 ms | batch taken |\n|---|---|---|---|")
        medians = {}
        for config, results in by_config.items():
            thr = [r["throughput"] for r in results]
            p99 = [r["p99_ms"] for r in results]
            medians[config] = (statistics.median(thr), statistics.median(p99))
            print(f"| {config} | {rounds.spread(thr)} | {rounds.spread(p99)} | "
                  f"{rounds.spread([r['batch'] for r in results], 3)} |")
        fixed = {c: m for c, m in medians.items() if c != "auto"}
        within = {c: m for c, m in fixed.items() if m[1] <= target} or fixed
        best = max(within, key=lambda c: within[c][0])
        ratio = medians["auto"][0] / within[best][0]
        verdicts[model] = ratio
        print(f"auto: {medians['auto'][0]:.4g} req/s = {ratio:.0%} of the sweep's best within "
              f"the target (batch {best}, {within[best][0]:.4g} req/s): "
              f"{'met' if ratio >= 0.9 else 'NOT met'} (>= 90 %)")
    path = rounds.save(args.out, "advisor-sweep", {"runs": runs, "ratios": verdicts,
                                                   "when": time.strftime("%F %T")})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
