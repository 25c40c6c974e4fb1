"""A workflow in one ``/wfpredict`` against the client calling its node models one after another.

The chain ``pre → tiny → post`` (``benchmarks/workflow_chain/``: two function nodes around the
tiny MLP, built into a ``.war`` by the real ``torch-workflow-archiver``) runs on one mservd:

- **workflow**: ``POST /wfpredict/bench_chain``, the daemon runs the three nodes;
- **client chain**: ``POST /predictions/bench_chain__pre``, then ``__tiny`` with its answer,
  then ``__post`` with that: the same three node models, three round trips.

Closed loops at ``--concurrency`` (default 1 and 16) for ``--seconds`` each; the two systems
alternate within every round (the order flips each round), so drift on a shared machine hits
both. Each answer is checked against the first one computed in process. Latency is one whole
chain, from the client's first send to the last answer. The client is ``http.client`` on
keep-alive connections, one thread per connection (the chain's client does three requests'
work per chain: that is its cost).

``python -m benchmarks.workflows --rounds 3 --seconds 4``
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.rounds import arguments, load1, save, spread
from benchmarks.systems import REPO, Mservd

HERE = Path(__file__).resolve().parent / "workflow_chain"
ROW = [float(i % 9) - 4.0 for i in range(64)]
NAME = "bench_chain"


def build_store(model_store: Path) -> Path:
    """A store holding tiny.mar and the chain's .war (built by the real CLI)."""
    spec = importlib.util.spec_from_file_location(
        "workflow_archives", REPO / "tests" / "fixtures" / "workflows" / "archive.py")
    assert spec is not None and spec.loader is not None
    archives = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(archives)
    store = Path(tempfile.mkdtemp(prefix="bench-workflow-store-"))
    try:
        os.link(model_store / "tiny.mar", store / "tiny.mar")
    except OSError:
        shutil.copy2(model_store / "tiny.mar", store / "tiny.mar")
    import subprocess

    subprocess.run([archives.archiver_cli(), "--workflow-name", NAME, "--spec-file",
                    str(HERE / "spec.yaml"), "--handler", str(HERE / "handler.py"),
                    "--export-path", str(store)], check=True, capture_output=True)
    return store


class Client:
    """One keep-alive connection: a whole chain per :meth:`run`."""

    def __init__(self, url: str, chained: bool) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.chained = chained

    def _post(self, path: str, body: bytes) -> bytes:
        self.conn.request("POST", path, body, {"Content-Type": "application/json"})
        answer = self.conn.getresponse()
        data = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{path}: {answer.status} {data[:200]!r}")
        return data

    def run(self, body: bytes) -> bytes:
        if not self.chained:
            return self._post(f"/wfpredict/{NAME}", body)
        for node in ("pre", "tiny", "post"):
            body = self._post(f"/predictions/{NAME}__{node}", body)
        return body


def same(answer: Any, expected: Any) -> bool:
    """The same class, and the score within float32 rounding: a batch of 8 rows sums in
    another order than one row alone."""
    return (answer.get("class") == expected["class"]
            and abs(answer.get("score", 0.0) - expected["score"]) <= 1e-5 * (
                1.0 + abs(expected["score"])))


def closed_loop(url: str, chained: bool, concurrency: int, seconds: float,
                expected: Any) -> dict[str, Any]:
    body = json.dumps(ROW).encode()
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    end = time.perf_counter() + seconds

    def loop() -> None:
        client = Client(url, chained)
        mine = []
        while time.perf_counter() < end:
            started = time.perf_counter()
            try:
                answer = json.loads(client.run(body))
            except Exception as exc:  # counted, and the run goes on
                with lock:
                    errors.append(str(exc)[:200])
                client = Client(url, chained)
                continue
            mine.append(time.perf_counter() - started)
            if not same(answer, expected):
                with lock:
                    errors.append(f"bad answer {answer!r}")
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=loop) for _ in range(concurrency)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - began
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000.0

    return {"chains": len(latencies), "per_s": len(latencies) / took, "errors": len(errors),
            "first_errors": errors[:3], "p50_ms": pct(0.5), "p99_ms": pct(0.99)}


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], rounds=3, seconds=4.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    store = build_store(args.store)
    system = Mservd(store, workers=1, batch_size=1, max_batch_delay=0, job_queue_size=1000)
    system.properties = {"load_workflows": f"{NAME}.war"}
    system.start([])
    runs: list[dict[str, Any]] = []
    try:
        url = system.inference_url
        expected = json.loads(Client(url, chained=True).run(json.dumps(ROW).encode()))
        assert same(json.loads(Client(url, chained=False).run(json.dumps(ROW).encode())), expected)
        for concurrency in args.concurrency:  # warm both paths up at this concurrency
            for chained in (False, True):
                closed_loop(url, chained, concurrency, 1.0, expected)
        for round_ in range(args.rounds):
            for concurrency in args.concurrency:
                order = (False, True) if round_ % 2 == 0 else (True, False)
                for chained in order:
                    run = {"round": round_, "concurrency": concurrency,
                           "system": "client chain" if chained else "workflow",
                           "load1": load1(),
                           **closed_loop(url, chained, concurrency, args.seconds, expected)}
                    runs.append(run)
                    print(f"round {round_} c={concurrency} {run['system']:<12} "
                          f"p50 {run['p50_ms']:.2f} ms  p99 {run['p99_ms']:.2f} ms  "
                          f"{run['per_s']:.0f} chains/s  errors {run['errors']}  "
                          f"load {run['load1']:.2f}", flush=True)
    finally:
        system.stop()
        system.cleanup()
        shutil.rmtree(store, ignore_errors=True)
    print("\nmedian (min–max) over the rounds:")
    for concurrency in args.concurrency:
        for name in ("workflow", "client chain"):
            mine = [r for r in runs if r["concurrency"] == concurrency and r["system"] == name]
            print(f"c={concurrency:<3} {name:<12} p50 {spread([r['p50_ms'] for r in mine], 3)} ms"
                  f"  p99 {spread([r['p99_ms'] for r in mine], 3)} ms"
                  f"  {spread([r['per_s'] for r in mine], 3)} chains/s"
                  f"  errors {sum(r['errors'] for r in mine)}")
    loads = [r["load1"] for r in runs]
    print(f"load average (1 min) before the runs: {min(loads):.2f}–{max(loads):.2f} "
          f"(median {statistics.median(loads):.2f})")
    print(f"results: {save(args.out, 'workflows', runs)}")


if __name__ == "__main__":
    main()
