"""The generation engine on the traffic LLM users send: mixed prompt lengths, a shared system
prompt, a long prompt joining running streams; side by side, alternating rounds.

    .venv/bin/python -m benchmarks.generation_engine [--before STORE] [--rounds 3]
        [--seconds 20] [--warmup 0] [--streams 16] [--no-torchserve]
        [--only throughput,prefix,interference]
        [--systems mservd,mservd before,torchserve,transformers CB,static generate()]
        [--variant NAME=SETTING]

Three measurements, each a few rounds in which the systems take turns (the order reversed
every other round); each figure is the median over the rounds with its range, and the load
average (1 min) is recorded before every window.

- ``throughput``: ``--streams`` clients send ``POST /predictions/smollm2`` back to back,
  streamed, EOS ignored (one seeded request list per workload, the same for every system):
  ``short`` prompts of 16 tokens, and ``mixed`` prompts of 16–1024 tokens; ``max_tokens``
  16–256 in both. A request still streaming when the window closes is dropped by its client
  (the server cancels it). With ``--warmup W`` the first W seconds of each window are not
  counted: the figures are of a steady state, not of every client's first request arriving at
  once. Per (system, workload): tokens/s in the window, time to first token
  p50/p99, the gap between tokens p50/p99. The systems: ``mservd`` (this checkout's daemon and
  sample), ``mservd before`` (the same daemon serving the archive in ``--before``: the sample
  built from an older commit, whose handler is the engine being replaced), ``torchserve``
  (TorchServe 0.12 in its own environment, serving this checkout's archive: the same handler),
  and ``transformers CB`` (transformers' own continuous-batching manager on its own thread in
  this process, with the engine's settings: the same blocks, page size and step budget; the
  clients are threads here, so it pays no HTTP), and ``static generate()`` (one
  ``generate()`` of the workload's first ``--streams`` requests together in this process,
  padded to the longest prompt and run to the largest ``max_tokens``, each row's own
  ``max_tokens`` counted: the limit on the short prompts, what padding costs on mixed ones;
  it has no window, so ``--seconds`` and ``--warmup`` do not apply to it).
- ``prefix``: one client sends a 1,000-token system prompt with a different short question
  each time (``max_tokens`` 16), one after another; time to first token of the requests after
  the first, prefix caching on (the sample) and off (the sample with ``handler:
  prefix_caching: false``).
- ``interference``: 4 streams generate 256 tokens each from short prompts; 3 s in, a client
  sends a 1,500-token prompt. The streams' longest gap between two tokens while it is
  prefilled, over their median gap.

Results: ``benchmarks/results/generation-engine-<time>.json`` (every round) and Markdown tables
on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from benchmarks.generation import RESULTS, Window, closed_loop
from benchmarks.generation import streamed as served
from benchmarks.generation_constrained import model_folder  # one token a part, cut at the window
from benchmarks.systems import REPO, Mservd, TorchServe, torchserve_available

STORE = REPO / "model_store"
ARCHIVE = STORE / "smollm2.mar"
WORDS = ("the", "city", "river", "old", "music", "light", "garden", "stone", "window", "story",
         "people", "morning", "water", "history", "mountain", "friend", "market", "winter",
         "letter", "bridge", "road", "school", "paper", "house")
WORKLOADS = {"short": (16, 16), "mixed": (16, 1024)}  # prompt tokens, low and high
TOKENS = (16, 256)  # max_tokens, low and high
REQUESTS = 2048
SYSTEM_PROMPT_TOKENS = 1000
LONG_PROMPT_TOKENS = 1500
QUESTIONS = ["What is the capital of France?", "Name three colours.", "Count to five.",
             "What is two plus two?", "Say hello in Spanish.", "Name a large animal.",
             "What day comes after Monday?"]


class Prompts:
    """Prompts of an exact token count, from SmolLM2's own tokenizer."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)

    def make(self, tokens: int, rng: random.Random) -> str:
        text = " ".join(rng.choice(WORDS) for _ in range(tokens + 8))
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
        return str(self.tokenizer.decode(ids))

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def workload(prompts: Prompts, name: str, seed: int = 7) -> list[dict[str, Any]]:
    """The workload's requests, the same for every system and round."""
    rng = random.Random(f"{name}-{seed}")
    low, high = WORKLOADS[name]
    return [{"prompt": prompts.make(rng.randint(low, high), rng),
             "max_tokens": rng.randint(*TOKENS), "ignore_eos": True} for _ in range(REQUESTS)]


def store_with(settings: str) -> Path:
    """A model store whose smollm2.mar is the sample with ``settings`` (``key: value``, one
    line) set in its model-config.yaml ``handler:`` block."""
    key = settings.split(":")[0].strip()
    store = Path(tempfile.mkdtemp(prefix="bench-store-"))
    with zipfile.ZipFile(ARCHIVE) as source, \
            zipfile.ZipFile(store / "smollm2.mar", "w", zipfile.ZIP_STORED) as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "model-config.yaml":
                lines = [line for line in data.decode().splitlines()
                         if not line.strip().startswith(f"{key}:")]
                at = lines.index("handler:") + 1
                data = "\n".join([*lines[:at], f"  {settings}", *lines[at:], ""]).encode()
            target.writestr(item, data)
    return store


MADE: dict[str, Path] = {}  # setting -> the store made for it, removed at the end


def variants(args: argparse.Namespace) -> dict[str, Path]:
    """The sample, and each ``--variant NAME=SETTING`` as a store of its own."""
    stores = {"mservd": STORE}
    for variant in args.variant:
        name, _, setting = variant.partition("=")
        if setting not in MADE:
            MADE[setting] = store_with(setting)
        stores[f"mservd {name}"] = MADE[setting]
    return stores


# -- clients ----------------------------------------------------------------------------

class TransformersCB:
    """transformers' continuous-batching manager on its own thread, as its users run it, with
    the sample's engine settings; a router thread hands each result to its request's queue."""

    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import (
            AutoModelForCausalLM,
            AutoTokenizer,
            ContinuousBatchingConfig,
            GenerationConfig,
        )

        sys.path.insert(0, str(REPO / "handlers"))
        import paged_engine  # the sample's KV sizing, so both hold the same blocks

        torch.set_num_threads(2)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        budget = paged_engine.kv_budget(self.model, "512MiB", torch.device("cpu"))
        config = ContinuousBatchingConfig(
            page_size=budget.page_size, num_blocks=budget.num_blocks, max_batch_tokens=512,
            max_memory_percent=1.0, allow_block_sharing=True, scheduler_type="fifo",
            use_cuda_graph=False, use_async_batching=False, auto_switch_to_flash=False)
        self.manager = self.model.init_continuous_batching(
            generation_config=GenerationConfig(do_sample=False, max_new_tokens=16,
                                               eos_token_id=-1),
            continuous_batching_config=config)
        self.manager.start()
        self.waiting: dict[str, queue.Queue] = {}
        self.lock = threading.Lock()
        self.running = True
        threading.Thread(target=self.route, daemon=True).start()
        self.count = 0

    def route(self) -> None:
        while self.running:
            result = self.manager.get_result(timeout=0.1)
            if result is not None:
                with self.lock:
                    target = self.waiting.get(result.request_id)
                if target is not None:
                    target.put((time.perf_counter(), result.is_finished()))

    def client(self, work: list[dict[str, Any]]) -> Callable[[int, Window], None]:
        def one(i: int, window: Window) -> None:
            body = work[i % len(work)]
            with self.lock:
                self.count += 1
                rid = f"r{self.count}"
                self.waiting[rid] = answers = queue.Queue[tuple[float, bool]]()
            started = time.perf_counter()
            ids = self.tokenizer(body["prompt"])["input_ids"]  # tokenised per request, as served
            self.manager.add_request(ids, request_id=rid, max_new_tokens=body["max_tokens"],
                                     streaming=True, eos_token_id=[])
            times: list[float] = []
            cut = False
            while True:
                at, finished = answers.get()
                times.append(at)
                if finished:
                    break
                if at > window.stop:
                    cut = True
                    self.manager.cancel_request(rid)
                    break
            with self.lock:
                del self.waiting[rid]
            window.record(started, times, body["max_tokens"] if not cut else len(times))

        return one

    def stop(self) -> None:
        self.running = False
        self.manager.stop(block=True)


class StaticBatch:
    """One ``generate()`` of the workload's first ``--streams`` requests together in this
    process, as a static-batching server runs a batch: every prompt left-padded to the
    longest, every row generated to the batch's largest ``max_tokens``, and only each row's
    own ``max_tokens`` counted. On equal short prompts it is this box's limit (one forward
    pass a step for all of them, nothing between); on mixed ones it pays the padding and the
    rows that are done, as a server without continuous batching would."""

    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(2)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def run(self, work: list[dict[str, Any]], streams: int) -> dict[str, Any]:
        """The batch's figures, named as a window's (its first token is every row's)."""
        from transformers import LogitsProcessor, LogitsProcessorList

        bodies = work[:streams]
        steps: list[float] = []

        class Clock(LogitsProcessor):
            def __call__(self, input_ids: Any, scores: Any) -> Any:
                steps.append(time.perf_counter())
                return scores

        load = os.getloadavg()[0]
        new = max(body["max_tokens"] for body in bodies)
        started = time.perf_counter()
        encoded = self.tokenizer([body["prompt"] for body in bodies], return_tensors="pt",
                                 padding=True)
        with self.torch.inference_mode():
            self.model.generate(**encoded, max_new_tokens=new, min_new_tokens=new,
                                do_sample=False, logits_processor=LogitsProcessorList([Clock()]),
                                pad_token_id=self.tokenizer.pad_token_id)
        took = time.perf_counter() - started
        gaps = [b - a for a, b in itertools.pairwise(steps)]
        first = (steps[0] - started) * 1000.0
        return {"streams": len(bodies), "tokens_per_s": sum(b["max_tokens"] for b in bodies)
                / took, "seconds": took, "ttft_p50_ms": first, "ttft_p99_ms": first,
                "itl_p50_ms": statistics.median(gaps) * 1000.0,
                "itl_p99_ms": sorted(gaps)[min(len(gaps) - 1, int(0.99 * len(gaps)))] * 1000.0,
                "requests": len(bodies), "errors": 0, "load1": load,
                "padded_prompt_tokens": int(encoded["input_ids"].shape[1]), "steps": new}

    def stop(self) -> None:
        del self.model


# -- the measurements -------------------------------------------------------------------

class KVWatch:
    """mservd's KV cache in use (describe's ``kvCache.usedTokens``, as its workers last said)
    beside the tokens the clients' sequences hold (each request in flight: its prompt and the
    tokens it received), sampled every ``every`` seconds from ``start`` on: the cache's peak
    over the sequences' own peak. The two views differ by up to a report's age (1.5 s: the
    handler reports every 0.5 s, its worker ships every second) and by a prompt still being
    prefilled in chunks (counted whole by its client)."""

    def __init__(self, management_url: str, held: dict[int, list[int]], start: float,
                 every: float = 0.25) -> None:
        self.url, self.held, self.start, self.every = management_url, held, start, every
        self.samples: list[tuple[int, int]] = []
        self.running = True
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def watch(self) -> None:
        http = requests.Session()
        while self.running:
            time.sleep(self.every)
            if time.perf_counter() < self.start:
                continue
            own = sum(prompt + got for prompt, got in list(self.held.values()))
            try:
                [model] = http.get(f"{self.url}/models/smollm2", timeout=5).json()
            except (requests.RequestException, ValueError):
                continue
            used = (model.get("kvCache") or {}).get("usedTokens", 0)  # its workers' sum
            self.samples.append((used, own))

    def stop(self) -> dict[str, Any]:
        self.running = False
        self.thread.join()
        peak_used = max((used for used, _ in self.samples), default=0)
        peak_own = max((own for _, own in self.samples), default=0)
        return {"kv_peak_used_tokens": peak_used, "kv_peak_own_tokens": peak_own,
                "kv_peak_ratio": peak_used / peak_own if peak_own else None,
                "kv_samples": len(self.samples)}


def throughput(args: argparse.Namespace, prompts: Prompts, folder: Path) -> dict[str, Any]:
    work = {name: workload(prompts, name) for name in WORKLOADS}
    sizes = {name: [prompts.count(body["prompt"]) for body in bodies]
             for name, bodies in work.items()}
    systems: list[tuple[str, Callable[[], Any]]] = [
        (name, lambda store=store: Mservd(store, 1, 16, 5, 1000))
        for name, store in variants(args).items()]
    if args.before:
        systems.append(("mservd before", lambda: Mservd(args.before, 1, 16, 5, 1000)))
    if not args.no_torchserve and torchserve_available() is None:
        systems.append(("torchserve", lambda: TorchServe(STORE, 1, 16, 5, 1000)))
    systems.append(("transformers CB", lambda: TransformersCB(folder)))
    systems.append(("static generate()", lambda: StaticBatch(folder)))
    if args.systems:
        systems = [(n, make) for n, make in systems if n in args.systems.split(",")]
    runs: dict[str, dict[str, list[dict]]] = {n: {w: [] for w in WORKLOADS} for n, _ in systems}
    held: dict[int, list[int]] = {}  # client thread -> [prompt tokens, tokens received]
    for r in range(args.rounds):
        for name, make in systems if r % 2 == 0 else systems[::-1]:
            system = make()
            try:
                if isinstance(system, StaticBatch):
                    for w in WORKLOADS:
                        runs[name][w].append(system.run(work[w], args.streams))
                        print(f"round {r + 1} {name} {w}: {runs[name][w][-1]}", flush=True)
                    continue
                if isinstance(system, TransformersCB):
                    clients = {w: system.client(work[w]) for w in WORKLOADS}
                    warm = system.client([{"prompt": "Hello", "max_tokens": 8}])
                else:
                    system.start(["smollm2"])
                    clients = {w: served(system.inference_url, work[w], held, sizes[w])
                               for w in WORKLOADS}
                    warm = served(system.inference_url,
                                  [{"prompt": "Hello", "max_tokens": 8, "ignore_eos": True}])
                closed_loop(2, 3.0, warm)
                for w in WORKLOADS:
                    watch = (KVWatch(system.management_url, held,
                                     time.perf_counter() + args.warmup)
                             if isinstance(system, Mservd) else None)
                    figures = closed_loop(args.streams, args.seconds, clients[w], args.warmup)
                    if watch is not None:
                        figures.update(watch.stop())
                    runs[name][w].append(figures)
                    print(f"round {r + 1} {name} {w}: " + " ".join(
                        f"{k}={v:.3g}" for k, v in figures.items()), flush=True)
            finally:
                system.stop()
                if hasattr(system, "cleanup"):
                    system.cleanup()
    return runs


def alternate(stores: dict[str, Path], rounds: int,
              measure: Callable[[str, int], Any]) -> dict[str, list[Any]]:
    """``measure(inference_url, round)`` on this checkout's daemon serving each store in turn,
    the order reversed every other round."""
    runs: dict[str, list[Any]] = {name: [] for name in stores}
    order = list(stores.items())
    for r in range(rounds):
        for name, store in order if r % 2 == 0 else order[::-1]:
            system = Mservd(store, 1, 16, 5, 1000)
            system.start(["smollm2"])
            try:
                runs[name].append(measure(system.inference_url, r))
                print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
            finally:
                system.stop()
                system.cleanup()
    return runs


def prefix(args: argparse.Namespace, prompts: Prompts) -> dict[str, Any]:
    rng = random.Random("system-prompt")
    system_prompt = "You are a helpful assistant. " + prompts.make(SYSTEM_PROMPT_TOKENS, rng)
    stores = {"prefix caching on": STORE, "prefix caching off": store_with("prefix_caching: false")}

    def firsts(url: str, r: int) -> dict[str, Any]:
        """Each question's time to its first token, one after another."""
        http = requests.Session()
        out = []
        for q, question in enumerate(QUESTIONS):
            body = {"prompt": f"{system_prompt}\n\nQuestion {r}.{q}: {question}\nAnswer:",
                    "max_tokens": 16, "ignore_eos": True}
            started = time.perf_counter()
            first = None
            with http.post(f"{url}/predictions/smollm2", json=body, stream=True,
                           timeout=600) as answer:
                answer.raise_for_status()
                for chunk in answer.iter_content(chunk_size=None):
                    if chunk and first is None:
                        first = time.perf_counter() - started
            out.append(first or 0.0)
        return {"first_token_s": out, "load1": os.getloadavg()[0]}

    try:
        return alternate(stores, args.rounds, firsts)
    finally:
        shutil.rmtree(stores["prefix caching off"], ignore_errors=True)


def interference(args: argparse.Namespace, prompts: Prompts) -> dict[str, Any]:
    long_prompt = prompts.make(LONG_PROMPT_TOKENS, random.Random("long-prompt"))
    stores = variants(args)
    if args.before:
        stores["mservd before"] = args.before
    return alternate(stores, args.rounds, lambda url, _r: one_interference(url, long_prompt))


def one_interference(url: str, long_prompt: str) -> dict[str, float]:
    """4 streams, a long prompt 3 s in: each stream's token times and the long one's start."""
    streams: list[list[float]] = [[] for _ in range(4)]
    load = os.getloadavg()[0]

    def stream(k: int) -> None:
        body = {"prompt": f"Tell me a long story about {WORDS[k]}.", "max_tokens": 256,
                "ignore_eos": True}
        with requests.post(f"{url}/predictions/smollm2", json=body, stream=True,
                           timeout=600) as answer:
            for chunk in answer.iter_content(chunk_size=None):
                if chunk:
                    streams[k].append(time.perf_counter())

    threads = [threading.Thread(target=stream, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(3.0)
    sent = time.perf_counter()
    first = None
    with requests.post(f"{url}/predictions/smollm2", stream=True, timeout=600,
                       json={"prompt": long_prompt, "max_tokens": 16, "ignore_eos": True}) as a:
        for chunk in a.iter_content(chunk_size=None):
            if chunk and first is None:
                first = time.perf_counter()
    for thread in threads:
        thread.join()
    gaps = [b - a for times in streams for a, b in itertools.pairwise(times)]
    during = [b - a for times in streams for a, b in itertools.pairwise(times)
              if b >= sent and a <= (first or sent)]
    median = statistics.median(gaps)
    longest = max(during) if during else 0.0
    return {"median_gap_ms": median * 1000, "longest_gap_ms": longest * 1000,
            "ratio": longest / median, "long_prompt_ttft_ms": ((first or sent) - sent) * 1000,
            "load1": load}


# -- tables -----------------------------------------------------------------------------

def spread(values: list[float], digits: int = 0) -> str:
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}–{max(values):.{digits}f})")


def report(results: dict[str, Any]) -> str:
    lines = []
    runs = results.get("throughput")
    if runs:
        lines += [("| system | workload | tokens/s | TTFT p50 ms | TTFT p99 ms | gap p50 ms | "
                  "gap p99 ms | errors | load |"), "|---|---|---|---|---|---|---|---|---|"]
        for name, by_workload in runs.items():
            for w, rows in by_workload.items():
                cells = [spread([row[k] for row in rows]) for k in
                         ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
                          "itl_p99_ms")]
                loads = [row["load1"] for row in rows]
                lines.append(f"| {name} | {w} | " + " | ".join(cells)
                             + f" | {sum(row['errors'] for row in rows)} | "
                             f"{min(loads):.1f}–{max(loads):.1f} |")
        lines.append("")
        for name, by_workload in runs.items():
            for w, rows in by_workload.items():
                ratios = [row["kv_peak_ratio"] for row in rows if row.get("kv_peak_ratio")]
                if ratios:
                    used = spread([row["kv_peak_used_tokens"] for row in rows])
                    own = spread([row["kv_peak_own_tokens"] for row in rows])
                    lines.append(f"- {name} {w}: KV cache peak {used} tokens, the sequences' "
                                 f"own peak {own}: {spread(ratios, 2)}")
        for name, by_workload in runs.items():
            mixed = statistics.median(r["tokens_per_s"] for r in by_workload["mixed"])
            short = statistics.median(r["tokens_per_s"] for r in by_workload["short"])
            lines.append(f"- {name}: mixed / short = {mixed / short:.2f}")
        def rate(name: str, w: str) -> float:
            return statistics.median(r["tokens_per_s"] for r in runs[name][w])

        for other in runs:
            if other != "mservd" and "mservd" in runs:
                lines.append(f"- mservd / {other}: " + ", ".join(
                    f"{w} {rate('mservd', w) / rate(other, w):.2f}×" for w in WORKLOADS))
        lines.append("")
    runs = results.get("prefix")
    if runs:
        lines += [("| prefix caching | first token, 1st request ms | later requests ms (median, "
                  "range over rounds) | load |"), "|---|---|---|---|"]
        medians = {}
        for name, rounds in runs.items():
            later = [statistics.median(row["first_token_s"][1:]) * 1000 for row in rounds]
            medians[name] = statistics.median(later)
            loads = [row["load1"] for row in rounds]
            lines.append(f"| {name} | {spread([row['first_token_s'][0] * 1000 for row in rounds])}"
                         f" | {spread(later)} | {min(loads):.1f}–{max(loads):.1f} |")
        on, off = medians["prefix caching on"], medians["prefix caching off"]
        lines += ["", f"- first token, off / on: {off / on:.1f}×", ""]
    runs = results.get("interference")
    if runs:
        lines += [("| system | median gap ms | longest gap ms | longest / median | long prompt "
                  "TTFT ms | load |"), "|---|---|---|---|---|---|"]
        for name, rows in runs.items():
            loads = [row["load1"] for row in rows]
            lines.append(f"| {name} | " + " | ".join(
                spread([row[k] for row in rows], 1 if k == "ratio" else 0)
                for k in ("median_gap_ms", "longest_gap_ms", "ratio", "long_prompt_ttft_ms"))
                + f" | {min(loads):.1f}–{max(loads):.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a model store with an older smollm2.mar")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="throughput: seconds of each window not counted, before --seconds "
                             "that are (a steady state instead of the first requests' burst)")
    parser.add_argument("--no-torchserve", action="store_true")
    parser.add_argument("--only", default="throughput,prefix,interference")
    parser.add_argument("--systems", help="throughput's systems, comma-separated (default all)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=SETTING",
                        help="also serve the sample with one handler setting changed, as "
                             "'mservd NAME' (e.g. 'prefill 128=prefill_tokens: 128')")
    args = parser.parse_args(argv)
    if not ARCHIVE.exists():
        raise SystemExit("Build the sample first: make samples")
    if args.before:
        args.before = args.before.resolve()
    folder = model_folder()
    prompts = Prompts(folder)
    results: dict[str, Any] = {"seconds": args.seconds, "streams": args.streams,
                               "rounds": args.rounds, "before": str(args.before or "")}
    only = args.only.split(",")
    for name, measure in (("prefix", lambda: prefix(args, prompts)),
                          ("interference", lambda: interference(args, prompts)),
                          ("throughput", lambda: throughput(args, prompts, folder))):
        if name in only:
            try:
                results[name] = measure()
            finally:
                for store in MADE.values():
                    shutil.rmtree(store, ignore_errors=True)
                MADE.clear()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"generation-engine-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=1))
    print(report(results))
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
