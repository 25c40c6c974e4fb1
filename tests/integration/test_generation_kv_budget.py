"""The SmolLM2 sample with a KV cache of a few blocks (model-config.yaml ``kvCacheMemory``), so
that what a full cache does really happens, each case checked to have happened: a prompt that
does not fit beside a running one waits for its blocks, sequences that outgrow the cache
together are preempted and recomputed, a request larger than the whole cache is refused; and
stop strings that span tokens, on the same small cache.

Every greedy answer is checked against the tokens transformers' ``generate()`` gives that
prompt alone, in this process (as ``test_generation.py`` does). The last test pins that the
cache a stop string's sequence held is reported free as soon as it ends.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

ARCHIVE = Path(__file__).resolve().parents[2] / "model_store" / "smollm2.mar"
WORKER_LOG = "model_smollm2.log"
# 4 blocks of 32 tokens at 45 KiB a token (SmolLM2-135M in float32): 128 tokens
KV_CACHE = "6MiB"
BLOCKS = 4
PAGE = 32  # tokens a block, on the CPU
# two prompts of 3 blocks each (65 to 96 tokens): one runs, the other waits for its blocks
LONG_PROMPTS = [
    ("The history of the Roman aqueducts is a story of engineering, politics and water. Over "
     "five centuries the city built eleven of them, carrying water from springs in the hills "
     "across valleys and plains to the fountains, baths and houses of Rome. The first, the Aqua "
     "Appia, was built in 312 BC. The longest of them"),
    ("A lighthouse keeper on a small island in the north sea kept a diary for forty years. "
     "Every night he wrote down the weather, the wind, the ships that passed, and the birds "
     "that rested on the rocks below the lamp. His daughter found the diaries in a chest after "
     "he died, and one cold winter she read them"),
]
LONG_TOKENS = 16
# three prompts of one block (at most 32 tokens) that grow into a second: 6 blocks wanted
SHORT_PROMPTS = [
    ("Once upon a time in a small village by the sea there lived an old fisherman and his "
     "wife, who had a little cat named"),
    ("The recipe for bread is simple: mix flour, water, salt and yeast, knead the dough for "
     "ten minutes, and then"),
    ("Write a list of fruits that grow on trees in the garden: apple, banana, cherry, plum, "
     "pear, peach,"),
]
SHORT_TOKENS = 12

pytestmark = pytest.mark.skipif(not ARCHIVE.exists(),
                                reason="the smollm2 sample is not built (make samples)")


def blocks(tokens: int) -> int:
    return -(-tokens // PAGE)


def small_cache_store(folder: Path) -> Path:
    """A model store whose smollm2.mar is the sample with ``kvCacheMemory: KV_CACHE``."""
    with zipfile.ZipFile(ARCHIVE) as source, \
            zipfile.ZipFile(folder / "smollm2.mar", "w", zipfile.ZIP_STORED) as target:
        for item in source.infolist():
            with source.open(item) as data, target.open(item.filename, "w") as copy:
                if item.filename == "model-config.yaml":
                    config, count = re.subn(rb"(?m)^kvCacheMemory:.*$",
                                            f"kvCacheMemory: {KV_CACHE}".encode(), data.read())
                    assert count == 1, "the sample's model-config.yaml sets kvCacheMemory"
                    copy.write(config)
                else:
                    shutil.copyfileobj(data, copy, 2**20)
    return folder


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    return small_cache_store(tmp_path_factory.mktemp("kv-budget-store"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, small_store):
    from conftest import Daemon

    daemon = Daemon(tmp_path_factory.mktemp("kv-budget"), small_store,
                    {"load_models": "smollm2.mar"})
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return daemon.openai_client()


@dataclass
class Reference:
    """The sample's model in this process: greedy answers of prompts alone, token counts."""

    tokenizer: Any
    model: Any
    answers: dict[tuple[str, int], str] = field(default_factory=dict)

    def tokens(self, prompt: str) -> int:
        return len(self.tokenizer(prompt)["input_ids"])  # as the handler tokenises a prompt

    def greedy(self, prompt: str, max_tokens: int) -> str:
        """The text of ``max_tokens`` greedy tokens after ``prompt`` (none of them EOS, so
        the server's answer runs to its length too)."""
        if (prompt, max_tokens) not in self.answers:
            ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
            out = self.model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
            new = out[0, ids.shape[1]:].tolist()
            assert len(new) == max_tokens, f"{prompt!r} ends before {max_tokens} tokens"
            self.answers[prompt, max_tokens] = self.tokenizer.decode(new,
                                                                     skip_special_tokens=True)
        return self.answers[prompt, max_tokens]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, small_store) -> Reference:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("smollm2-model")
    with zipfile.ZipFile(small_store / "smollm2.mar") as archive:  # stored: quick to extract
        archive.extractall(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return Reference(AutoTokenizer.from_pretrained(folder), model)


@pytest.fixture(scope="module")
def capacity(reference) -> int:
    """The tokens the daemon's KV cache holds, by the handler's own arithmetic."""
    import torch

    from handlers import paged_engine

    budget = paged_engine.kv_budget(reference.model, KV_CACHE, torch.device("cpu"))
    assert (budget.num_blocks, budget.page_size) == (BLOCKS, PAGE)
    return budget.tokens


@dataclass
class Streamed:
    """A streamed completion: its text, how it ended, and when its text began and ended."""

    text: str = ""
    finish_reason: str | None = None
    sent: float = 0.0  # time.monotonic() when it was sent
    first: float = 0.0  # of its first text
    last: float = 0.0  # of its last event
    began: threading.Event = field(default_factory=threading.Event)


def stream(client: openai.OpenAI, prompt: str, max_tokens: int, out: Streamed | None = None,
           **kwargs: Any) -> Streamed:
    out = out or Streamed()
    out.sent = time.monotonic()
    for chunk in client.completions.create(model="smollm2", prompt=prompt, max_tokens=max_tokens,
                                           temperature=0, stream=True, **kwargs):
        now = time.monotonic()
        choice = chunk.choices[0]
        if choice.text:
            out.text += choice.text
            if not out.first:
                out.first = now
                out.began.set()
        out.finish_reason = choice.finish_reason or out.finish_reason
        out.last = now
    return out


def complete(client: openai.OpenAI, prompt: str, max_tokens: int, **kwargs: Any):
    return client.completions.create(model="smollm2", prompt=prompt, max_tokens=max_tokens,
                                     temperature=0, **kwargs).choices[0]


def kv_cache(daemon) -> dict[str, Any]:
    from conftest import wait_until

    # the worker reports its cache at its steps: there after the first request
    return wait_until(lambda: daemon.describe("smollm2")[0].get("kvCache"), 10,
                      "the worker's KV cache in describe")


def test_a_long_prompt_that_does_not_fit_beside_a_running_one_waits_and_both_answer_whole(
        client, daemon, reference, capacity) -> None:
    first, second = LONG_PROMPTS
    assert all(reference.tokens(p) + LONG_TOKENS <= capacity for p in LONG_PROMPTS), \
        "each fits the cache alone"
    assert blocks(reference.tokens(first)) + blocks(reference.tokens(second)) > BLOCKS, \
        "the second prompt has no room while the first runs"
    expected = [reference.greedy(p, LONG_TOKENS) for p in LONG_PROMPTS]
    running = Streamed()
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(stream, client, first, LONG_TOKENS, running)
        assert running.began.wait(60), "the first prompt's first token"
        b = pool.submit(stream, client, second, LONG_TOKENS)
        a, b = a.result(), b.result()
    assert (a.text, a.finish_reason) == (expected[0], "length")
    assert (b.text, b.finish_reason) == (expected[1], "length")
    # sent while the first ran, it was queued, not run beside it: its first token came
    # after the first prompt's last
    assert a.first < b.sent < a.last < b.first
    kv = kv_cache(daemon)
    assert kv["capacityTokens"] == capacity


def test_sequences_that_outgrow_the_cache_together_are_preempted_and_answer_exactly(
        client, daemon, reference, capacity) -> None:
    assert all(reference.tokens(p) <= PAGE for p in SHORT_PROMPTS), "one block each to begin"
    wanted = sum(blocks(reference.tokens(p) + SHORT_TOKENS - 1) for p in SHORT_PROMPTS)
    assert wanted > BLOCKS, "together they outgrow the cache"
    expected = [reference.greedy(p, SHORT_TOKENS) for p in SHORT_PROMPTS]
    mark = daemon.log_end(WORKER_LOG)
    with ThreadPoolExecutor(len(SHORT_PROMPTS)) as pool:
        answers = list(pool.map(lambda p: complete(client, p, SHORT_TOKENS), SHORT_PROMPTS))
    assert [(a.text, a.finish_reason) for a in answers] == [(e, "length") for e in expected]
    # transformers' words when it frees a sequence's blocks to recompute it later
    assert re.search(r"Offloaded \d+ requests \(0 to CPU, [1-9]\d* soft reset\)",
                     daemon.read_log(WORKER_LOG, mark)), daemon.read_log(WORKER_LOG, mark)


def test_a_request_larger_than_the_whole_kv_cache_is_refused_while_one_beside_it_generates(
        client, reference, capacity) -> None:
    ids = reference.tokenizer(" ".join(LONG_PROMPTS))["input_ids"][:capacity - 8]
    prompt = reference.tokenizer.decode(ids)
    fits = capacity - reference.tokens(prompt)  # the max_tokens that fill the cache exactly
    assert 1 <= fits <= 16
    running = Streamed()
    with ThreadPoolExecutor(1) as pool:
        beside = pool.submit(stream, client, SHORT_PROMPTS[0], SHORT_TOKENS, running)
        assert running.began.wait(60), "the request beside it generates"
        with pytest.raises(openai.BadRequestError) as refused:
            complete(client, prompt, fits + 1)
        refused_at = time.monotonic()
        beside = beside.result()
    assert refused_at < beside.last  # refused while the other generated
    assert refused.value.status_code == 400
    error = refused.value.body
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "context_length_exceeded"
    assert f"more than the {capacity} tokens this worker's KV cache holds" in error["message"]
    assert "kvCacheMemory" in error["message"]
    assert (beside.text, beside.finish_reason) == (reference.greedy(SHORT_PROMPTS[0],
                                                                    SHORT_TOKENS), "length")
    # the cache's own size is served: prompt and max_tokens of exactly its tokens
    whole = client.completions.create(model="smollm2", prompt=prompt, max_tokens=fits,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert whole.choices[0].finish_reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (capacity - fits, fits)


# its greedy text: " three\n4. four\n5. five\n6. six\n7. seven..."
STOP_PROMPT = "Count:\n1. one\n2. two\n3."
STOP_TOKENS = 16


@pytest.fixture(scope="module")
def counted(client) -> str:
    """STOP_PROMPT's greedy text without a stop, from the daemon."""
    answer = complete(client, STOP_PROMPT, STOP_TOKENS)
    assert answer.finish_reason == "length"
    return answer.text


# a stop of several tokens; one that ends inside a token (" five"); the earlier of two found
@pytest.mark.parametrize("stop", ["\n6.", [". fi"], ["\n9.", "r\n5"]])
def test_a_stop_string_across_tokens_ends_the_text_exactly_before_it(
        client, reference, counted, stop) -> None:
    stops = [stop] if isinstance(stop, str) else stop
    assert all(len(reference.tokenizer(s, add_special_tokens=False)["input_ids"]) > 1
               for s in stops)
    found = [at for s in stops if (at := counted.find(s)) >= 0]
    assert found and min(found) > 0, f"{counted!r} holds one of {stops!r}, after some text"
    expected = counted[:min(found)]
    answer = complete(client, STOP_PROMPT, STOP_TOKENS, stop=stop)
    assert (answer.text, answer.finish_reason) == (expected, "stop")
    assert not any(s in answer.text for s in stops)
    # streamed, the text that may begin the stop is held back until the next tokens tell
    streamed = stream(client, STOP_PROMPT, STOP_TOKENS, stop=stop)
    assert (streamed.text, streamed.finish_reason) == (expected, "stop")


def test_the_kv_cache_is_reported_free_once_a_stop_string_ended_the_last_sequence(
        client, daemon) -> None:
    from conftest import wait_until

    def generated() -> float:
        return sum(v for k, v in daemon.metrics().items() if k.startswith("GeneratedTokens"))

    counts: list[float] = []

    def settled() -> bool:
        """The same count twice, a shipment apart (the worker ships its step reports every
        second): the earlier tests' reports have all come."""
        counts.append(generated())
        return len(counts) > 1 and counts[-1] == counts[-2]

    wait_until(settled, 10, "the generated tokens' count to hold still", interval=1.5)
    before = counts[-1]
    answer = client.completions.create(model="smollm2", prompt=STOP_PROMPT,
                                       max_tokens=STOP_TOKENS, temperature=0, stop="\n6.")
    assert answer.choices[0].finish_reason == "stop"
    # its last step's report (its tokens and the cache's use, shipped together) has come
    wait_until(lambda: generated() >= before + answer.usage.completion_tokens, 10,
               "the answer's tokens in /metrics")
    assert kv_cache(daemon)["usedTokens"] == 0
