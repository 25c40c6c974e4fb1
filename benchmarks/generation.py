"""Generation under concurrent streams: SmolLM2 served with continuous batching, side by side.

    .venv/bin/python -m benchmarks.generation [--rounds 3] [--seconds 10] [--streams 1,4,16,32]
                                             [--no-torchserve] [--only mservd,torchserve]
                                             [--before-code CHECKOUT [--before-store STORE]]

Each system gets closed loops of 1, 4, 16 and 32 concurrent clients; every request asks for
64 new tokens (EOS ignored) after one of a few fixed prompts, and each client sends its next
request as soon as its answer ends. Per (system, streams): aggregate tokens/s over the window,
time to first token p50/p99, inter-token latency p50/p99. The systems:

- ``mservd``: the smollm2 sample (continuous batching, 16 sequences), streamed over
  ``POST /predictions/smollm2`` in HTTP chunks (one per step);
- ``torchserve``: TorchServe 0.12 serving the same ``.mar`` with its own continuous batching,
  same route and client (skipped when it is not installed or does not start);
- ``mservd before`` (with ``--before-code CHECKOUT``): the daemon's code of another checkout
  (put first on ``PYTHONPATH``, so its every process runs it) serving the same archive: a
  before/after of the serving path alone, or of the whole with ``--before-store`` (a store
  holding that checkout's own build of the sample);
- ``one at a time``: ``generate()`` per request in this process, one after another (KServe's
  Hugging Face fallback serves this way);
- ``static batching``: this process, batches of up to 8 taken after a 5 ms wait, each batch
  generated together with ``generate()`` to its end;
- ``one batch of 16``: a single ``generate()`` of 16 prompts in this process, the limit of this
  box (tokens/s only).

In-process systems time tokens with a logits processor (called once per step); served ones by
the HTTP chunks they stream. The systems take turns, round after round (the order reversed
every other round); each figure is the median over the rounds with its range. Results:
``benchmarks/results/generation-<time>.json`` (every round) and a Markdown table on stdout,
with the load averages before the windows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import statistics
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from benchmarks.systems import REPO, Mservd, TorchServe, torchserve_available

NEW_TOKENS = 64
PROMPTS = ["The history of the city of Paris begins", "Write a short story about a robot who",
           "The most important ideas in physics are", "Here is a recipe for bread:",
           "Explain how a computer works.", "Once upon a time in a small village,",
           "The best way to learn a language is", "Ten facts about the ocean:"]
RESULTS = REPO / "benchmarks" / "results"


class Window:
    """What the clients saw in one measuring window."""

    def __init__(self, stop: float, start: float = float("-inf")) -> None:
        self.start = start  # time.perf_counter() when counting begins (after a warm-up)
        self.stop = stop  # time.perf_counter() when the window closes
        self.lock = threading.Lock()
        self.tokens = 0
        self.first: list[float] = []  # seconds to the first token, per request
        self.gaps: list[float] = []  # seconds between tokens
        self.errors = 0

    def record(self, started: float, times: list[float], tokens: int) -> None:
        """One request's token times; only what came between the window's start and its
        close counts (a request wholly inside counts its ``tokens``, one part may carry two),
        and its time to first token only if it was sent inside."""
        inside = [t for t in times if self.start <= t <= self.stop]
        with self.lock:
            self.tokens += tokens if len(inside) == len(times) else len(inside)
            if inside and started >= self.start and inside[0] == times[0]:
                self.first.append(inside[0] - started)
            self.gaps.extend(b - a for a, b in itertools.pairwise(inside))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def closed_loop(streams: int, seconds: float, one: Callable[[int, Window], None],
                warmup: float = 0.0) -> dict:
    """``streams`` clients, each calling ``one`` back to back until the window ends; what
    they see in the first ``warmup`` seconds is not counted (a steady state, not the burst of
    every client's first request)."""
    started = time.perf_counter() + warmup
    window = Window(started + seconds, started if warmup else float("-inf"))
    load = os.getloadavg()[0]

    def client(index: int) -> None:
        i = index
        while time.perf_counter() < window.stop:
            try:
                one(i, window)
            except Exception:  # counted: a failed request is part of what the window shows
                with window.lock:
                    window.errors += 1
            i += streams

    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # the requests in flight finish: the next window starts on an idle server
    took = seconds
    ms = 1000.0
    p = percentile
    return {"streams": streams, "tokens_per_s": window.tokens / took, "seconds": took,
            "ttft_p50_ms": (p(window.first, 0.5) or 0) * ms,
            "ttft_p99_ms": (p(window.first, 0.99) or 0) * ms,
            "itl_p50_ms": (p(window.gaps, 0.5) or 0) * ms,
            "itl_p99_ms": (p(window.gaps, 0.99) or 0) * ms,
            "requests": len(window.first), "errors": window.errors, "load1": load}


# -- served: mservd and TorchServe, one HTTP client ------------------------------------------

def streamed(url: str, work: list[dict[str, Any]], held: dict[int, list[int]] | None = None,
             sizes: list[int] | None = None, cut_at_close: bool = True
             ) -> Callable[[int, Window], None]:
    """Streams ``work`` to ``url``, request after request; one still streaming when the window
    closes is dropped (the server cancels it) unless ``cut_at_close`` is False. With ``held``:
    each client thread's request in flight there as [its prompt's tokens (``sizes``), tokens
    received so far]."""
    session = threading.local()

    def one(i: int, window: Window) -> None:
        http = getattr(session, "http", None) or requests.Session()
        session.http = http
        body = work[i % len(work)]
        started = time.perf_counter()
        times: list[float] = []
        cut = False
        mine = [sizes[i % len(work)] if sizes else 0, 0]
        if held is not None:
            held[threading.get_ident()] = mine
        try:
            with http.post(f"{url}/predictions/smollm2", json=body, stream=True,
                           timeout=600) as answer:
                if answer.status_code != 200:
                    raise RuntimeError(answer.text[:200])
                for chunk in answer.iter_content(chunk_size=None):
                    if chunk:
                        times.append(time.perf_counter())
                        mine[1] += 1
                    if cut_at_close and time.perf_counter() > window.stop:
                        cut = True  # dropped: the window is over, the server cancels it
                        break
        finally:
            if held is not None:
                held.pop(threading.get_ident(), None)
        if cut:
            http.close()
            session.http = None
        window.record(started, times, body["max_tokens"] if not cut else len(times))

    return one


def served(url: str) -> Callable[[int, Window], None]:
    """The fixed prompts, each request to its end (the window counts what came inside it)."""
    work = [{"prompt": prompt, "max_tokens": NEW_TOKENS, "ignore_eos": True}
            for prompt in PROMPTS]
    return streamed(url, work, cut_at_close=False)


# -- in this process: one at a time, static batching, one batch ----------------------------

class Local:
    """SmolLM2 in this process, timed by a logits processor called once per step."""

    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(2)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def generate(self, prompts: list[str]) -> list[float]:
        """Generate NEW_TOKENS for each prompt together; the time of each step."""
        from transformers import LogitsProcessor, LogitsProcessorList

        steps: list[float] = []

        class Clock(LogitsProcessor):
            def __call__(self, input_ids, scores):
                steps.append(time.perf_counter())
                return scores

        encoded = self.tokenizer(prompts, return_tensors="pt", padding=True)
        with self.torch.inference_mode():
            self.model.generate(**encoded, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                do_sample=False, logits_processor=LogitsProcessorList([Clock()]),
                                pad_token_id=self.tokenizer.pad_token_id)
        return steps


def local_server(model: Local, batch: int, delay: float) -> Callable[[int, Window], None]:
    """A worker thread taking up to ``batch`` requests (waiting ``delay`` for company) and
    generating each batch to its end; ``batch=1`` is one at a time."""
    waiting: queue.Queue = queue.Queue()

    def worker() -> None:
        while True:
            first = waiting.get()
            taken = [first]
            deadline = time.perf_counter() + delay
            while len(taken) < batch:
                left = deadline - time.perf_counter()
                try:
                    taken.append(waiting.get(timeout=max(0.0, left)) if left > 0
                                 else waiting.get_nowait())
                except queue.Empty:
                    break
            steps = model.generate([prompt for prompt, _ in taken])
            for _, done in taken:
                done.put(steps)

    threading.Thread(target=worker, daemon=True).start()

    def one(i: int, window: Window) -> None:
        done: queue.Queue = queue.Queue()
        started = time.perf_counter()
        waiting.put((PROMPTS[i % len(PROMPTS)], done))
        window.record(started, done.get(), NEW_TOKENS)

    return one


def one_batch(model: Local, size: int) -> dict:
    model.generate(PROMPTS[:2])  # warm-up
    started = time.perf_counter()
    model.generate([PROMPTS[i % len(PROMPTS)] for i in range(size)])
    took = time.perf_counter() - started
    return {"streams": size, "tokens_per_s": size * NEW_TOKENS / took, "seconds": took,
            "load1": os.getloadavg()[0]}


# -- the run ----------------------------------------------------------------------------

class MservdFrom(Mservd):
    """mservd run from another checkout's code, on this checkout's model store."""

    def __init__(self, code: Path, *args: Any) -> None:
        super().__init__(*args)
        self.code = code

    def command(self, models: list[str]) -> tuple[list[str], dict[str, str]]:
        cmd, env = super().command(models)
        return cmd, {**env, "PYTHONPATH": str(self.code)}


def run(seconds: float, streams: list[int], with_torchserve: bool, rounds: int,
        only: set[str] | None = None, before_code: Path | None = None,
        before_store: Path | None = None) -> dict[str, Any]:
    """Every system in turn, ``rounds`` times, the order reversed every other round (A, B, C,
    then C, B, A): each figure's median and range over the rounds."""
    store = REPO / "model_store"
    archive = store / "smollm2.mar"
    if not archive.exists():
        raise SystemExit("Build the sample first: make samples")
    served_systems: list[tuple[str, Any]] = [("mservd", lambda: Mservd(store, 1, 16, 5))]
    if before_code is not None:
        served_systems.append(("mservd before",
                               lambda: MservdFrom(before_code, before_store or store, 1, 16,
                                                  5)))
    if with_torchserve and torchserve_available() is None:
        served_systems.append(("torchserve", lambda: TorchServe(store, 1, 16, 5)))
    served_systems = [(n, make) for n, make in served_systems if only is None or n in only]
    model = None
    if only is None or only - {"mservd", "torchserve", "mservd before"}:
        folder = RESULTS / "smollm2-model"
        stamp = folder / "config.json"
        if not stamp.exists() or stamp.stat().st_mtime < archive.stat().st_mtime:
            with zipfile.ZipFile(archive) as mar:
                mar.extractall(folder)
            stamp.touch()
        model = Local(folder)

    def measure_served(make: Callable[[], Any]) -> list[dict] | dict:
        system = make()
        try:
            system.start(["smollm2"])
        except Exception as exc:  # reported, not hidden: the table says why it is missing
            return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        try:
            one = served(system.inference_url)
            closed_loop(2, 3.0, one)  # warm-up
            return [closed_loop(n, seconds, one) for n in streams]
        finally:
            system.stop()

    def measure_local(batch: int, delay: float) -> list[dict]:
        one = local_server(model, batch, delay)
        closed_loop(1, 2.0, one)  # warm-up
        # one at a time serves one stream at any concurrency (its queue only grows): past 4
        # streams a window would wait minutes for the requests still queued at its end
        return [closed_loop(n, seconds, one) for n in streams if batch > 1 or n <= 4]

    plan: list[tuple[str, Callable[[], Any]]] = [
        (name, lambda make=make: measure_served(make)) for name, make in served_systems]
    if model is not None:
        plan += [("one at a time", lambda: measure_local(1, 0.0)),
                 ("static batching", lambda: measure_local(8, 0.005)),
                 ("one batch of 16", lambda: [one_batch(model, 16)])]
    runs: dict[str, list[Any]] = {name: [] for name, _ in plan}
    for r in range(rounds):
        for name, measure in (plan if r % 2 == 0 else plan[::-1]):
            print(f"round {r + 1}: {name}", flush=True)
            runs[name].append(measure())
    return {"new_tokens": NEW_TOKENS, "seconds": seconds, "rounds": rounds, "runs": runs,
            "systems": {name: summarize(rows) for name, rows in runs.items()}}


FIGURES = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")


def summarize(rounds: list[Any]) -> list[dict] | dict:
    """Per stream count, each figure's median and (min, max) over the rounds that ran."""
    ran = [r for r in rounds if isinstance(r, list)]
    if not ran:
        return rounds[0]
    out = []
    for i, first in enumerate(ran[0]):
        rows = [r[i] for r in ran]
        row: dict[str, Any] = {"streams": first["streams"], "rounds": len(rows),
                               "load1": [row["load1"] for row in rows],
                               "errors": sum(row.get("errors", 0) for row in rows)}
        for key in FIGURES:
            values = [row[key] for row in rows if key in row]
            if values:
                row[key] = statistics.median(values)
                row[key + "_range"] = (min(values), max(values))
        out.append(row)
    return out


def table(results: dict[str, Any]) -> str:
    lines = [("| system | streams | tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | ITL p50 (ms) | "
              "ITL p99 (ms) | errors |"), "|---|---|---|---|---|---|---|---|"]

    def cell(row: dict, key: str) -> str:
        if key not in row:
            return ""
        low, high = row[key + "_range"]
        return f"{row[key]:.0f} ({low:.0f}–{high:.0f})"

    loads = []
    for name, rows in results["systems"].items():
        if isinstance(rows, dict):
            lines.append(f"| {name} | — | did not run: {rows['error']} |")
            continue
        for row in rows:
            loads += row["load1"]
            lines.append(f"| {name} | {row['streams']} | "
                         + " | ".join(cell(row, key) for key in FIGURES)
                         + f" | {row['errors']} |")
    if loads:
        lines.append(f"\nmedians over {results['rounds']} rounds (min–max); load average (1 min)"
                     f" before the windows {min(loads):.1f}–{max(loads):.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", default="1,4,16,32")
    parser.add_argument("--no-torchserve", action="store_true")
    parser.add_argument("--only", help="comma-separated: mservd, torchserve, mservd before "
                                       "(served only)")
    parser.add_argument("--before-code", type=Path,
                        help="another checkout whose daemon code also serves, as 'mservd before'")
    parser.add_argument("--before-store", type=Path,
                        help="with --before-code: the model store it serves (its own smollm2.mar,"
                             " built from that checkout); this checkout's by default")
    args = parser.parse_args(argv)
    streams = [int(n) for n in args.streams.split(",")]
    only = set(args.only.split(",")) if args.only else None
    results = run(args.seconds, streams, not args.no_torchserve, args.rounds, only,
                  args.before_code, args.before_store)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"generation-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2))
    print(table(results))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
