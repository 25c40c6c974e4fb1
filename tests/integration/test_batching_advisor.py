"""The batching advisor against a handler of known cost (20 ms + 2 ms per request): it fits
t(B) = c + m*B from live batches, shows the fit in describe, /metrics and `mservd models
advise`, and with batchSize: auto and a latency target the batcher takes the batch it advises."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon, write_archive

    write_archive(store, "costly", "costs_per_batch.py",
                  config={"batchSize": "auto", "maxLatencyMs": 100, "maxBatchDelay": 5,
                          "minWorkers": 1, "maxWorkers": 1})
    write_archive(store, "costlyfixed", "costs_per_batch.py",
                  config={"batchSize": 16, "maxBatchDelay": 5, "minWorkers": 1,
                          "maxWorkers": 1})
    daemon = Daemon(tmp_path_factory.mktemp("advisor"), store,
                    {"load_models": "costly.mar,costlyfixed.mar"})
    daemon.start()
    yield daemon
    daemon.stop()


def load(daemon, model: str, seconds: float, concurrency: int = 24) -> list[int]:
    """A closed loop; the batch sizes the answers report."""
    url = daemon.url("inference", f"/predictions/{model}")
    headers = {"Authorization": f"Bearer {daemon.key('inference')}"}
    end = time.monotonic() + seconds

    def client(_: int) -> list[int]:
        sizes, session = [], requests.Session()
        while time.monotonic() < end:
            answer = session.post(url, data=b"x", headers=headers, timeout=30)
            if answer.status_code == 200:
                sizes.append(int(answer.text))
        return sizes

    with ThreadPoolExecutor(concurrency) as pool:
        return [size for sizes in pool.map(client, range(concurrency)) for size in sizes]


def test_the_fit_finds_the_handlers_cost_and_shows_it_everywhere(daemon) -> None:
    from conftest import wait_until

    load(daemon, "costlyfixed", 6)
    cost = wait_until(lambda: daemon.describe("costlyfixed")[0].get("batchCost"), 10,
                      "a fit in describe")
    # the handler sleeps 20 ms + 2 ms a request; the hops to the worker and back add a little
    # (5 ms on a slow minute in CI), and a sleep on a loaded machine may overshoot more
    assert 20 <= cost["fixedMs"] <= 60, cost
    assert 1.5 <= cost["perItemMs"] <= 4.0, cost
    assert cost["r2"] > 0.5 and cost["batchSizes"] >= 2  # timing noise on a shared machine
    # the smallest batch near the speed-up's ceiling, 9c/m: about 90 here, so the largest
    # advised (64), or 32 where the overhead per request tilts the line under 64
    knee = 9 * cost["fixedMs"] / cost["perItemMs"]
    assert cost["advice"]["batchSize"] == (64 if knee >= 64 else 32), cost
    metrics = daemon.metrics()
    labels = 'model_name="costlyfixed",model_version="1.0"'
    assert metrics[f"mservd_batch_fixed_cost_seconds{{{labels}}}"] == pytest.approx(
        cost["fixedMs"] / 1000, rel=0.01)
    assert metrics[f"mservd_batch_size_limit{{{labels}}}"] == 16  # a set size is kept
    shown = subprocess.run(
        [sys.executable, "-m", "mservd", "models", "advise", "costlyfixed", "--target-ms", "100",
         "--log-dir", str(daemon.log_dir)], capture_output=True, text=True, timeout=60,
        check=False)
    assert shown.returncode == 0, shown.stderr
    assert "speed-up ceiling" in shown.stdout and "SPEED-UP S(B)" in shown.stdout
    assert "advised for a 100 ms target: batch size" in shown.stdout


def test_auto_batching_takes_the_batch_its_latency_target_allows(daemon) -> None:
    from conftest import wait_until

    assert daemon.describe("costly")[0]["batchSizeNow"] == 8  # before any fit
    load(daemon, "costly", 8)
    described = wait_until(lambda: daemon.describe("costly")[0], 5, "describe")
    # two batch times (the one in progress, then its own) within 80 % of 100 ms: a batch of 8
    # takes 36 ms here, and 8 is the largest rung of the ladder that fits — unless a slow
    # machine's overhead stretches it past 40 ms, and then 4 is what the target allows
    assert described["batchSize"] == "auto" and described["maxLatencyMs"] == 100
    cost = described["batchCost"]
    [eight] = [m for m in cost["measured"] if m["batchSize"] == 8]
    allowed = 8 if 2 * eight["batchMs"] <= 80 else 4
    assert cost["advice"]["batchSize"] == allowed, cost
    assert described["batchSizeNow"] in (4, 8), described
    sizes = load(daemon, "costly", 3)  # 24 clients: batches would be larger if it let them
    # never past 8 (16 would break the target); the advice, measured, is what mostly runs
    assert max(sizes) <= 8 and allowed in sizes, Counter(sizes)
    assert Counter(sizes).most_common(1)[0][0] in (4, 8), Counter(sizes)
