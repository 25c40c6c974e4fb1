"""Generative models: SmolLM2 served with continuous batching, tokens streamed over
/predictions and OpenAI's API, checked with the real ``openai`` client."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

PROMPTS = ["What is the capital of France?", "Name three colors.", "Count from one to five."]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    daemon = Daemon(tmp_path_factory.mktemp("generation"), store,
                    {"load_models": "smollm2.mar,minilm.mar"}, args=("--enable-model-api",))
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return daemon.openai_client()


@pytest.fixture(scope="module")
def generate(store, tmp_path_factory):
    """A chat's greedy answer from transformers' generate(), the chat alone, in this process."""
    import zipfile

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("smollm2-model")
    with zipfile.ZipFile(store / "smollm2.mar") as archive:
        archive.extractall(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def answer(messages: list[dict], max_tokens: int) -> str:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                            return_tensors="pt")["input_ids"]
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    return answer


@pytest.fixture(scope="module")
def alone(generate) -> dict[str, str]:
    """Each prompt's greedy answer from transformers' generate(), one prompt at a time."""
    return {prompt: generate([{"role": "user", "content": prompt}], 24) for prompt in PROMPTS}


def chat(client, prompt: str, **kwargs):
    return client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": prompt}], **kwargs)


def test_concurrent_greedy_answers_are_the_tokens_generate_gives_each_prompt_alone(
        client, alone) -> None:
    with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        answers = list(pool.map(lambda p: chat(client, p, max_tokens=24), PROMPTS * 2))
    for prompt, answer in zip(PROMPTS * 2, answers):
        assert answer.choices[0].message.content == alone[prompt]


def test_chat_answers_with_usage_and_finish_reason(client) -> None:
    answer = chat(client, PROMPTS[0], max_tokens=20)
    assert answer.object == "chat.completion" and answer.model == "smollm2"
    assert answer.choices[0].message.content == "The capital of France is Paris."
    assert answer.choices[0].finish_reason == "stop"
    usage = answer.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens == 7
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    cut = chat(client, PROMPTS[0], max_tokens=3)
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3


def test_metrics_count_generated_tokens_and_time_the_first_and_the_next(client,
                                                                          daemon) -> None:
    from conftest import wait_until

    labels = 'model_name="smollm2",model_version="1.0"'
    first = f"mservd_time_to_first_token_seconds_count{{{labels}}}"

    def generated(metrics: dict[str, float]) -> float:
        return sum(v for k, v in metrics.items() if k.startswith("GeneratedTokens"))

    before = daemon.metrics()
    list(chat(client, PROMPTS[0], max_tokens=20, stream=True))
    chat(client, PROMPTS[0], max_tokens=20)

    def counted() -> dict[str, float] | None:  # metrics arrive a moment after the answers
        metrics = daemon.metrics()
        if (generated(metrics) >= generated(before) + 14
                and metrics.get(first, 0) >= before.get(first, 0) + 2):
            return metrics
        return None

    metrics = wait_until(counted, 10, "the two chats' tokens and first tokens in /metrics")
    assert metrics[f"mservd_inter_token_latency_seconds_count{{{labels}}}"] > 0


def test_a_repeated_system_prompt_is_found_in_the_kv_cache_as_describe_and_metrics_show(
        client, daemon) -> None:
    from conftest import wait_until

    system = "You are a careful assistant who answers in one short sentence. " * 12
    labels = 'model_name="smollm2",model_version="1.0"'
    before = daemon.describe("smollm2")[0]["kvCache"]["prefixHitTokens"]
    for question in PROMPTS[:2]:
        client.chat.completions.create(model="smollm2", max_tokens=4, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": question}])

    def reused() -> dict | None:  # the worker reports its cache every half second
        kv = daemon.describe("smollm2")[0]["kvCache"]
        return kv if kv["prefixHitTokens"] >= before + 128 else None

    kv = wait_until(reused, 10, "the second chat's system prompt found in the KV cache")
    assert kv["capacityTokens"] > 0 and 0 <= kv["usedTokens"] <= kv["capacityTokens"]
    assert kv["usageRatio"] == round(kv["usedTokens"] / kv["capacityTokens"], 4)
    metrics = daemon.metrics()
    assert 0 <= metrics[f"mservd_kv_cache_usage_ratio{{{labels}}}"] <= 1
    assert metrics[f"mservd_prefix_cache_hit_tokens_total{{{labels}}}"] >= before + 128
    assert "kvCache" not in daemon.describe("minilm")[0]  # not a generation handler


def test_concurrent_chats_reusing_a_cached_system_prompt_answer_what_generate_gives_alone(
        client, daemon, generate) -> None:
    """One chat puts a system prompt of several blocks in the KV cache; four more with it,
    at once, share those blocks instead of computing them, and each greedy answer is the one
    generate() gives its chat alone."""
    from conftest import wait_until

    system = "You answer questions about geography and colours in a few words. " * 10
    chats = [[{"role": "system", "content": system}, {"role": "user", "content": question}]
             for question in (*PROMPTS, "Which ocean is the largest?")]
    client.chat.completions.create(model="smollm2", max_tokens=2, messages=chats[0])
    before = daemon.describe("smollm2")[0]["kvCache"]["prefixHitTokens"]
    with ThreadPoolExecutor(len(chats)) as pool:
        answers = list(pool.map(lambda messages: client.chat.completions.create(
            model="smollm2", max_tokens=16, messages=messages), chats))

    def reused() -> int | None:  # the worker reports its cache every half second
        hits = daemon.describe("smollm2")[0]["kvCache"]["prefixHitTokens"] - before
        return hits if hits >= 4 * 96 else None

    wait_until(reused, 10, "the four chats' system prompt found in the KV cache")
    for messages, answer in zip(chats, answers):
        assert answer.choices[0].message.content == generate(messages, 16)


def test_chat_streams_each_token_as_an_event_then_usage(client) -> None:
    events = list(chat(client, PROMPTS[0], max_tokens=20, stream=True,
                       stream_options={"include_usage": True}))
    deltas = [e.choices[0].delta.content or "" for e in events if e.choices]
    assert deltas[0] == "The" and len([d for d in deltas if d]) == 7
    assert "".join(deltas) == "The capital of France is Paris."
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == "stop"
    assert events[-1].usage.completion_tokens == 7


def test_sse_ends_with_done_on_the_wire(daemon) -> None:
    body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4,
            "stream": True}
    answer = requests.post(daemon.url("inference", "/openai/v1/completions"), json=body,
                           headers=daemon._headers("inference", None), timeout=60)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [line for line in answer.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    texts = [json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts) == " Paris.\n\n"


def test_completion_stops_at_a_stop_string(client) -> None:
    answer = client.completions.create(model="smollm2", prompt="The capital of France is",
                                       max_tokens=10, stop=["."])
    assert answer.choices[0].text == " Paris"
    assert answer.choices[0].finish_reason == "stop"


COUNT = "Count from 1 to 30, as '1. 1' lines"


@pytest.mark.parametrize(("stop", "ends"), [("\n6.", "5. 5"), ([". 4"], "3. 3\n4")],
                         ids=["newline-six-dot", "dot-space-four"])
def test_a_stop_string_across_tokens_cuts_the_chat_answer_exactly_before_it(
        client, stop, ends) -> None:
    """The answers ended '5. 5\n6' and '3. 3\n4. ', streamed and not: the start of the stop
    string had gone out before its end came."""
    with ThreadPoolExecutor(3) as pool:
        whole = pool.submit(chat, client, COUNT, max_tokens=40)
        cut = pool.submit(chat, client, COUNT, max_tokens=40, stop=stop)
        streamed = pool.submit(lambda: list(chat(client, COUNT, max_tokens=40,
                                                 stop=stop, stream=True)))
        whole, cut, events = whole.result(), cut.result(), streamed.result()
    text = cut.choices[0].message.content
    assert text.endswith(ends) and cut.choices[0].finish_reason == "stop"
    first = stop if isinstance(stop, str) else stop[0]
    assert whole.choices[0].message.content.startswith(text + first)
    pieces = [e.choices[0].delta.content or "" for e in events if e.choices]
    assert "".join(pieces) == text
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == "stop"


def test_sampling_with_a_seed_repeats_itself(client) -> None:
    first, second = (chat(client, PROMPTS[1], max_tokens=12, temperature=0.9, top_p=0.9,
                          seed=7).choices[0].message.content for _ in range(2))
    assert first == second


def test_sampling_settings_that_would_break_the_shared_step_fail_alone(
        daemon, client, alone) -> None:
    """Every running sequence shares one decoding step: a temperature of 1e-40 (inf logits),
    a NaN one, or a top_p below 0 made the sampler raise there and failed them all."""
    def predict(settings: dict) -> requests.Response:
        body = json.dumps({"prompt": "Hi", "max_tokens": 4, **settings})  # NaN as JSON allows
        return requests.post(daemon.url("inference", "/predictions/smollm2"), data=body,
                             headers=daemon._headers("inference", {"Content-Type":
                                                                   "application/json"}),
                             timeout=60)

    with ThreadPoolExecutor(6) as pool:
        good = [pool.submit(chat, client, p, max_tokens=24) for p in PROMPTS]
        tiny = pool.submit(chat, client, PROMPTS[0], max_tokens=24, temperature=1e-40)
        hostile = [pool.submit(predict, s) for s in ({"temperature": float("nan")},
                                                      {"top_p": -1})]
        for prompt, answer in zip(PROMPTS, good):
            assert answer.result().choices[0].message.content == alone[prompt]
        assert tiny.result().choices[0].message.content == alone[PROMPTS[0]]  # greedy
        for refused, word in zip(hostile, ("temperature", "top_p")):
            assert refused.result().status_code == 400 and word in refused.result().text


def test_predictions_route_streams_the_same_tokens_in_http_chunks(daemon) -> None:
    body = {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 20}
    answer = requests.post(daemon.url("inference", "/predictions/smollm2"), json=body,
                           headers=daemon._headers("inference", None), stream=True, timeout=60)
    chunks = [c.decode() for c in answer.iter_content(chunk_size=None)]
    assert answer.status_code == 200 and len(chunks) > 1
    assert "".join(chunks) == "The capital of France is Paris."


def test_embeddings_come_from_an_embedding_model(client) -> None:
    answer = client.embeddings.create(model="minilm", input=["hello world", "goodbye"])
    assert [d.index for d in answer.data] == [0, 1]
    assert all(len(d.embedding) == 384 for d in answer.data)


def test_models_are_listed_for_openai_and_kserve_clients_alike(client, daemon) -> None:
    assert {m.id for m in client.models.list()} == {"minilm", "smollm2"}
    assert client.models.retrieve("smollm2").id == "smollm2"
    kserve = requests.get(daemon.url("inference", "/v1/models"),
                          headers=daemon._headers("inference", None), timeout=10).json()
    assert sorted(kserve["models"]) == ["minilm", "smollm2"]


def test_describe_customized_asks_minilms_handler_and_refuses_a_continuous_model(daemon) -> None:
    answer = daemon.manage("GET", "/models/minilm?customized=true")
    assert answer.status_code == 200, answer.text
    [minilm] = answer.json()  # a BaseHandler without describe_handle of its own: nothing added
    assert minilm["modelName"] == "minilm" and "customizedMetadata" not in minilm
    refused = daemon.manage("GET", "/models/smollm2?customized=true")
    assert refused.status_code == 400 and "continuously" in refused.json()["message"]


def test_openai_errors_have_openais_shape(client) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["code"] == "ModelNotFoundException"
    with pytest.raises(openai.BadRequestError, match='"n" must be an integer from 1 to 8'):
        chat(client, "hi", n=9)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        chat(client, "hi", temperature=5)
    with pytest.raises(openai.BadRequestError, match="context"):
        chat(client, "hi", max_tokens=9000)


def test_a_client_that_leaves_mid_stream_frees_its_slot(daemon, store) -> None:
    """With one slot, a second request runs only if the first one's slot was freed: the
    first would otherwise generate thousands of tokens (EOS ignored)."""
    added = daemon.manage("POST", "/models?url=smollm2.mar&model_name=onelane&batch_size=1"
                                  "&initial_workers=1&synchronous=true")
    assert added.status_code == 200, added.text
    headers = daemon._headers("inference", None)
    long = {"model": "onelane", "prompt": "Once upon a time", "max_tokens": 4000,
            "ignore_eos": True, "stream": True}
    with requests.post(daemon.url("inference", "/v1/completions"), json=long, headers=headers,
                       stream=True, timeout=60) as first:
        lines = first.iter_lines()
        assert next(line for line in lines if line).startswith(b"data: ")
    # the connection is closed: the next request gets the slot
    second = requests.post(daemon.url("inference", "/v1/completions"), headers=headers,
                           json={"model": "onelane", "prompt": "Hello", "max_tokens": 3},
                           timeout=120)
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["completion_tokens"] == 3


def test_triton_generate_answers_whole_and_generate_stream_by_events(daemon) -> None:
    headers = daemon._headers("inference", None)
    body = {"text_input": "The capital of France is", "parameters": {"max_tokens": 4}}
    whole = requests.post(daemon.url("inference", "/v2/models/smollm2/generate"), json=body,
                          headers=headers, timeout=60)
    assert whole.status_code == 200, whole.text
    assert whole.json()["text_output"] == " Paris.\n\n"
    assert whole.json()["model_name"] == "smollm2"
    streamed = requests.post(daemon.url("inference", "/v2/models/smollm2/generate_stream"),
                             json=body, headers=headers, timeout=60)
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(e.removeprefix("data: ")) for e in streamed.text.split("\n\n") if e]
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == " Paris.\n\n"
    bad = requests.post(daemon.url("inference", "/v2/models/smollm2/generate"),
                        json={"parameters": {}}, headers=headers, timeout=60)
    assert bad.status_code == 400 and "text_input" in bad.json()["error"]


def test_a_worker_that_dies_mid_stream_ends_it_with_an_error_event(daemon, client) -> None:
    import os
    import signal

    added = daemon.manage("POST", "/models?url=smollm2.mar&model_name=fragile"
                                  "&initial_workers=1&synchronous=true")
    assert added.status_code == 200, added.text
    [pid] = daemon.worker_pids("fragile")
    long = {"model": "fragile", "prompt": "Once upon a time", "max_tokens": 4000,
            "ignore_eos": True, "stream": True}
    with requests.post(daemon.url("inference", "/v1/completions"), json=long, stream=True,
                       headers=daemon._headers("inference", None), timeout=60) as answer:
        lines = (line for line in answer.iter_lines() if line)
        assert next(lines).startswith(b"data: {")
        os.kill(pid, signal.SIGKILL)
        rest = list(lines)  # ends: no client waits on a dead worker
    assert rest[-1] == b"data: [DONE]"
    error = json.loads(rest[-2].removeprefix(b"data: "))["error"]
    # it had streamed: not run again elsewhere (its client would get its parts twice)
    assert error["message"].startswith("Worker died") and error["type"] == "server_error"
    assert chat(client, PROMPTS[0], max_tokens=20).choices[0].message.content.startswith("The")


def test_a_generation_past_its_deadline_ends_its_stream_with_an_error_event(daemon) -> None:
    """X-Request-Timeout-Ms bounds the whole generation: past it the stream ends with an
    error event (504's type) and [DONE], and the sequence's slot is free for the next."""
    # long enough for the first token on a loaded minute (else the answer is a plain 504; 5 s
    # was not, with both cores busy), far too short for 4,000 tokens
    headers = {**daemon._headers("inference", None), "X-Request-Timeout-Ms": "10000"}
    long = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 4000,
            "ignore_eos": True, "stream": True}
    answer = requests.post(daemon.url("inference", "/v1/completions"), json=long,
                           headers=headers, timeout=60)
    events = [e for e in answer.text.split("\n\n") if e]
    assert answer.status_code == 200 and events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "RequestTimeoutException" and "deadline" in error["message"]
    texts = [json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-2]]
    assert 0 < len(texts) < 4000
    assert daemon.describe("smollm2")[0]["jobQueueStatus"]["pendingRequests"] == 0


def test_a_bad_request_fails_alone_while_others_generate(daemon) -> None:
    headers = daemon._headers("inference", None)
    url = daemon.url("inference", "/predictions/smollm2")
    good = {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 20}
    with requests.post(url, json=good, headers=headers, stream=True, timeout=60) as running:
        chunks = running.iter_content(chunk_size=None)
        first = next(chunks).decode()
        for bad in ({"prompt": "x", "seed": "seven"}, {"prompt": "x", "stop": [1, 2]},
                    {"prompt": "x", "temperature": "hot"}, {"prompt": 5},
                    {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}):
            refused = requests.post(url, json=bad, headers=headers, timeout=60)
            assert refused.status_code == 400, (bad, refused.text)
        rest = "".join(c.decode() for c in chunks)
    assert first + rest == "The capital of France is Paris."
