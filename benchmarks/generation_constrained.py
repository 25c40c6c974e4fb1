"""What constrained decoding costs a token: the same chat requests with and without
``response_format`` (a JSON schema), served by the smollm2 sample, and the grammar libraries'
own per-token cost on SmolLM2's 49,152-token vocabulary.

    .venv/bin/python -m benchmarks.generation_constrained [--rounds 3] [--requests 6]
                                                         [--streams 1,4] [--no-libraries]

Served: for each number of concurrent streams, each client sends ``--requests`` streamed chat
requests one after another (``max_tokens`` 64, one of a few prompts asking for a story), with
``response_format`` json_schema (an object with one long string, so that the answer runs as
long as a free one) or without; the two kinds take turns, round after round (the order
reversed every other round). Per request: time to the first token, and the time per token
after it (from the first to the last chunk, over the completion tokens the usage counts
after the first); per (kind, streams) the median over the requests of each round, then the
median and range over the rounds, with the load averages before each window.

Libraries: the mask a grammar computes before each token, applied to one row of logits, and
the token followed, on a walk of 60 tokens through a JSON schema (each pick the likeliest
allowed token of random logits), for each of llguidance, xgrammar and outlines-core that is
installed; medians per token, and the time to compile the schema (and, once, the tokenizer).

Results: ``benchmarks/results/generation-constrained-<time>.json`` and Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import requests

from benchmarks.systems import REPO, Mservd

RESULTS = REPO / "benchmarks" / "results"
MAX_TOKENS = 64
PROMPTS = ["Tell me a story about a robot.", "Tell me a story about the sea.",
           "Tell me a story about a small village.", "Tell me a story about a baker."]
STORY = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                          "story": {"type": "string"}},
         "required": ["title", "story"], "additionalProperties": False}
WALK_SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    "city": {"enum": ["Paris", "London", "Berlin"]}},
    "required": ["name", "age", "tags", "city"], "additionalProperties": False}


# -- served -----------------------------------------------------------------------------------

def one_request(url: str, prompt: str, constrained: bool) -> dict[str, float]:
    body: dict[str, Any] = {"model": "smollm2", "max_tokens": MAX_TOKENS, "stream": True,
                            "stream_options": {"include_usage": True},
                            "messages": [{"role": "user", "content": prompt}]}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "story", "schema": STORY, "strict": True}}
    started = time.perf_counter()
    times: list[float] = []
    tokens = 0
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=True,
                       timeout=300) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            doc = json.loads(line[6:])
            if doc.get("usage"):
                tokens = doc["usage"]["completion_tokens"]
            elif doc["choices"] and (doc["choices"][0]["delta"].get("content")
                                     or doc["choices"][0]["finish_reason"]):
                times.append(time.perf_counter())
    out = {"ttft_ms": (times[0] - started) * 1e3, "tokens": tokens}
    if tokens > 1 and len(times) > 1:
        out["per_token_ms"] = (times[-1] - times[0]) * 1e3 / (tokens - 1)
    return out


def window(url: str, streams: int, count: int, constrained: bool) -> dict[str, Any]:
    """``streams`` clients, each sending ``count`` requests in turn: the medians."""
    rows: list[dict[str, float]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for j in range(count):
            row = one_request(url, PROMPTS[(i + j) % len(PROMPTS)], constrained)
            with lock:
                rows.append(row)

    load = os.getloadavg()[0]
    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_token = [r["per_token_ms"] for r in rows if "per_token_ms" in r]
    return {"streams": streams, "constrained": constrained, "load1": load,
            "requests": len(rows), "tokens_median": statistics.median(r["tokens"] for r in rows),
            "ttft_ms": statistics.median(r["ttft_ms"] for r in rows),
            "per_token_ms": statistics.median(per_token) if per_token else None}


def served(rounds: int, count: int, streams: list[int]) -> list[dict[str, Any]]:
    store = REPO / "model_store"
    if not (store / "smollm2.mar").exists():
        raise SystemExit("Build the sample first: make samples")
    system = Mservd(store, 1, 16, 5)
    system.start(["smollm2"])
    rows: list[dict[str, Any]] = []
    try:
        url = system.inference_url
        window(url, 2, 1, False)  # warm-up: both kinds, and the grammar engine's tokenizer
        window(url, 2, 1, True)
        for r in range(rounds):
            for n in streams:
                kinds = (False, True) if r % 2 == 0 else (True, False)
                for constrained in kinds:
                    print(f"round {r + 1}: {n} streams, "
                          f"{'constrained' if constrained else 'free'}", flush=True)
                    rows.append({"round": r + 1, **window(url, n, count, constrained)})
    finally:
        system.stop()
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for n in sorted({r["streams"] for r in rows}):
        for constrained in (False, True):
            mine = [r for r in rows if r["streams"] == n and r["constrained"] == constrained]
            row: dict[str, Any] = {"streams": n, "constrained": constrained,
                                   "load1": [round(r["load1"], 2) for r in mine]}
            for key in ("per_token_ms", "ttft_ms", "tokens_median"):
                values = [r[key] for r in mine if r[key] is not None]
                row[key] = statistics.median(values)
                row[key + "_range"] = (min(values), max(values))
            out.append(row)
    return out


# -- the libraries ----------------------------------------------------------------------------

def model_folder() -> Path:
    folder = RESULTS / "smollm2-model"
    archive = REPO / "model_store" / "smollm2.mar"
    stamp = folder / "config.json"
    if not stamp.exists() or stamp.stat().st_mtime < archive.stat().st_mtime:
        with zipfile.ZipFile(archive) as mar:
            mar.extractall(folder)
        stamp.touch()
    return folder


def walk(fill, apply, accept, done, vocab: int, steps: int = 60) -> dict[str, float]:
    import torch

    generator = torch.Generator().manual_seed(1)
    fills, applies, accepts = [], [], []
    for _ in range(steps):
        logits = torch.randn(vocab, generator=generator)
        t0 = time.perf_counter()
        fill()
        t1 = time.perf_counter()
        logits = apply(logits)
        t2 = time.perf_counter()
        token = int(torch.argmax(logits))
        t3 = time.perf_counter()
        accept(token)
        t4 = time.perf_counter()
        fills.append(t1 - t0)
        applies.append(t2 - t1)
        accepts.append(t4 - t3)
        if done():
            break
    ms = 1e3
    return {"tokens": len(fills), "mask_ms": statistics.median(fills) * ms,
            "apply_ms": statistics.median(applies) * ms,
            "accept_ms": statistics.median(accepts) * ms,
            "per_token_ms": (statistics.median(fills) + statistics.median(applies)
                             + statistics.median(accepts)) * ms}


def libraries() -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_folder())
    vocab = len(tokenizer)
    out: dict[str, Any] = {}
    for name, measure in (("llguidance", _llguidance), ("xgrammar", _xgrammar),
                          ("outlines-core", _outlines)):
        try:
            out[name] = measure(tokenizer, vocab)
        except ImportError:
            out[name] = {"error": "not installed"}
    return out


def _llguidance(tokenizer: Any, vocab: int) -> dict[str, Any]:
    import llguidance.hf

    from handlers.constrained import Constraint, apply_bitmask, json_schema_grammar

    t0 = time.perf_counter()
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    t1 = time.perf_counter()
    matcher = llguidance.LLMatcher(ll_tokenizer, json_schema_grammar(WALK_SCHEMA))
    t2 = time.perf_counter()
    constraint = Constraint(matcher, vocab)
    state: dict[str, Any] = {}

    def fill() -> None:
        state["bits"] = matcher.compute_bitmask()

    def apply(logits):
        return apply_bitmask(state["bits"], logits)  # the handler's own (Constraint.mask)

    row = walk(fill, apply, constraint.accept, lambda: constraint.done, vocab)
    return {**row, "tokenizer_ms": (t1 - t0) * 1e3, "compile_ms": (t2 - t1) * 1e3}


def _xgrammar(tokenizer: Any, vocab: int) -> dict[str, Any]:
    import xgrammar

    t0 = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    compiler = xgrammar.GrammarCompiler(info, max_threads=1)
    t1 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(WALK_SCHEMA), any_whitespace=False)
    t2 = time.perf_counter()
    matcher = xgrammar.GrammarMatcher(compiled)
    bitmask = xgrammar.allocate_token_bitmask(1, vocab)

    def apply(logits):
        xgrammar.apply_token_bitmask_inplace(logits.view(1, -1), bitmask)
        return logits

    row = walk(lambda: matcher.fill_next_token_bitmask(bitmask), apply, matcher.accept_token,
               matcher.is_terminated, vocab)
    return {**row, "tokenizer_ms": (t1 - t0) * 1e3, "compile_ms": (t2 - t1) * 1e3}


def _outlines(tokenizer: Any, vocab: int) -> dict[str, Any]:
    import torch
    from outlines_core import Guide, Index, Vocabulary, json_schema

    t0 = time.perf_counter()
    eos = tokenizer.eos_token_id
    words: dict[str, list[int]] = {}
    for token, i in tokenizer.get_vocab().items():
        if i != eos:
            words.setdefault(tokenizer.convert_tokens_to_string([token]), []).append(i)
    vocabulary = Vocabulary(eos, words)
    t1 = time.perf_counter()
    guide = Guide(Index(json_schema.build_regex_from_schema(json.dumps(WALK_SCHEMA)),
                        vocabulary))
    t2 = time.perf_counter()
    state: dict[str, Any] = {}

    def fill() -> None:
        state["allowed"] = torch.tensor(guide.get_tokens())

    def apply(logits):
        mask = torch.full_like(logits, float("-inf"))
        mask[state["allowed"]] = 0
        return logits + mask

    row = walk(fill, apply, guide.advance, guide.is_finished, vocab)
    return {**row, "tokenizer_ms": (t1 - t0) * 1e3, "compile_ms": (t2 - t1) * 1e3}


# -- report -----------------------------------------------------------------------------------

def report(results: dict[str, Any]) -> str:
    lines = []
    if results.get("served"):
        lines += [("| streams | response_format | per token after the first (ms) | "
                  "first token (ms) | tokens per answer | load1 before each window |"),
                  "|---|---|---|---|---|---|"]
        for row in results["served"]:
            lo, hi = row["per_token_ms_range"]
            flo, fhi = row["ttft_ms_range"]
            lines.append(f"| {row['streams']} | {'json_schema' if row['constrained'] else '-'}"
                         f" | {row['per_token_ms']:.1f} ({lo:.1f}–{hi:.1f}) | "
                         f"{row['ttft_ms']:.0f} ({flo:.0f}–{fhi:.0f}) | "
                         f"{row['tokens_median']:.0f} | {row['load1']} |")
    if results.get("libraries"):
        lines += ["", ("| library | mask (ms) | apply (ms) | follow (ms) | per token (ms) | "
                  "compile the schema (ms) | tokenizer, once (ms) |"), "|---|---|---|---|---|---|---|"]
        for name, row in results["libraries"].items():
            if "error" in row:
                lines.append(f"| {name} | {row['error']} | | | | | |")
                continue
            lines.append(f"| {name} | {row['mask_ms']:.3f} | {row['apply_ms']:.3f} | "
                         f"{row['accept_ms']:.3f} | {row['per_token_ms']:.3f} | "
                         f"{row['compile_ms']:.1f} | {row['tokenizer_ms']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6, help="per client and window")
    parser.add_argument("--streams", default="1,4")
    parser.add_argument("--no-libraries", action="store_true")
    parser.add_argument("--no-served", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "max_tokens": MAX_TOKENS, "load_before": os.getloadavg()}
    if not args.no_libraries:
        results["libraries"] = libraries()
    if not args.no_served:
        rows = served(args.rounds, args.requests, [int(s) for s in args.streams.split(",")])
        results["served_rounds"] = rows
        results["served"] = summarize(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"generation-constrained-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1))
    print(report(results))
    print(f"\n(results: {path})")


if __name__ == "__main__":
    main()
