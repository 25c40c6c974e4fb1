"""What a request's content can cost, on every model kind, with token auth on: bytes that no
parser or template can read, inputs past every bound, prompts past the context. Each fails
alone, before the compute it would have cost, while the requests beside it (in its batch, or
in its decoding step) are answered."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

OCTETS = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon, write_archive

    write_archive(store, "failsmid", "fails_mid_stream.py",
                  config={"continuousBatching": True, "batchSize": 4, "maxBatchDelay": 0})
    daemon = Daemon(tmp_path_factory.mktemp("hostile-content"), store,
                    {"load_models": "smollm2.mar,failsmid.mar"}, args=("--enable-model-api",))
    daemon.start()
    # a second minilm and tiny whose batches wait to fill: a hostile body shares them
    for name, mar in (("minibatch", "minilm.mar"), ("tinybatch", "tiny.mar")):
        added = daemon.manage("POST", f"/models?url={mar}&model_name={name}&batch_size=8"
                                      "&max_batch_delay=1500&initial_workers=1"
                                      "&synchronous=true")
        assert added.status_code == 200, added.text
    yield daemon
    daemon.stop()


def post(daemon, path: str, **kwargs) -> requests.Response:
    headers = daemon._headers("inference", kwargs.pop("headers", None))
    return requests.post(daemon.url("inference", path), headers=headers, timeout=120, **kwargs)


@pytest.mark.parametrize(("model", "good", "hostile"), [
    ("minibatch", lambda i: f"sentence number {i}".encode(), b'{"a":' * 30000),
    ("tinybatch", lambda i: json.dumps([i / 10] * 64).encode(), b"[" * 50000),
], ids=["embedder", "tiny-sample"])
def test_json_nested_too_deeply_fails_alone_in_a_batch(daemon, model, good, hostile) -> None:
    """It raised RecursionError out of the handler's preprocess and failed all the batch."""
    pids = daemon.worker_pids(model)
    with ThreadPoolExecutor(7) as pool:
        goods = [pool.submit(daemon.predict, model, data=good(i), headers=OCTETS)
                 for i in range(6)]
        bad = pool.submit(daemon.predict, model, data=hostile, headers=OCTETS)
        answers = [f.result() for f in goods]
        refused = bad.result()
    assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
    assert refused.status_code == 400 and "nested too deeply" in refused.json()["message"]
    assert daemon.worker_pids(model) == pids


def stream(daemon, prompt: str, max_tokens: int) -> list[bytes]:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}
    with post(daemon, "/v1/completions", json=body, stream=True) as answer:
        assert answer.status_code == 200, answer.text
        return [line for line in answer.iter_lines() if line]


def test_a_hostile_generation_request_fails_alone_beside_running_streams(daemon) -> None:
    """'[' * 50000 ended every running stream with a RecursionError event."""
    with ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(stream, daemon, f"Story {i}:", 24) for i in range(3)]
        bad = pool.submit(post, daemon, "/predictions/smollm2", data=b"[" * 50000,
                          headers=OCTETS)
        refused = bad.result()
        events = [s.result() for s in streams]
    assert refused.status_code == 400, refused.text
    assert refused.json()["message"] == "The JSON body is nested too deeply to parse."
    for lines in events:
        assert lines[-1] == b"data: [DONE]" and b'"error"' not in b"".join(lines)
        texts = [json.loads(line.removeprefix(b"data: "))["choices"][0]["text"]
                 for line in lines[:-1]]
        assert len("".join(texts)) > 0


def test_embeddings_refuse_more_inputs_than_a_request_may_carry(daemon) -> None:
    """4,000 one-letter inputs held the worker 18 s and then failed on the answer's size."""
    client = daemon.openai_client()
    import openai

    with pytest.raises(openai.BadRequestError, match="a request may carry at most 64"):
        client.embeddings.create(model="minibatch", input=["a"] * 4000)
    many = client.embeddings.create(model="minibatch", input=["a"] * 63 + ["a long one " * 90])
    assert len(many.data) == 64 and [d.index for d in many.data] == list(range(64))
    alone = client.embeddings.create(model="minibatch", input="a")
    assert many.data[0].embedding == pytest.approx(alone.data[0].embedding, abs=1e-5)


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/v1/completions", {"model": "smollm2", "prompt": "x" * 1_000_001},
     "at most 1000000 are served"),
    ("/v1/chat/completions", {"model": "smollm2",
                              "messages": [{"role": "user", "content": "hi"}] * 1025},
     "at most 1024 are served"),
    ("/predictions/smollm2", {"prompt": "x" * 6_000_000},
     "at most 131072 (handler.max_prompt_characters)"),
    ("/predictions/smollm2", {"messages": [{"role": "user", "content": "hi"}] * 1025},
     "at most 1024 (handler.max_messages)"),
    ("/predictions/smollm2", {"prompt": "word " * 9000},
     "this model takes at most 8192 (handler.max_prompt_tokens)"),
], ids=["openai-characters", "openai-messages", "characters", "messages", "tokens"])
def test_prompts_past_their_bounds_are_refused_before_templating(daemon, path, body,
                                                                  words) -> None:
    """A 6 MB prompt was templated and tokenised inside the step every stream waits on (9.75 s
    to its 400); the bounds are now checked on its size first, in the frontend or on the
    worker's reading thread."""
    answer = post(daemon, path, json=body)
    assert answer.status_code == 400, answer.text
    assert words in answer.text


def test_top_p_of_zero_is_refused_not_taken_for_one(daemon) -> None:
    client = daemon.openai_client()
    import openai

    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model="smollm2", prompt="Hi", max_tokens=2, top_p=0)
    answer = post(daemon, "/predictions/smollm2", json={"prompt": "Hi", "top_p": 0})
    assert answer.status_code == 400 and "top_p must be above 0" in answer.json()["message"]


def test_a_step_that_fails_mid_stream_ends_it_with_openais_error_object(daemon) -> None:
    """The error event's message was the repr of a Python dict."""
    body = {"model": "failsmid", "prompt": "x", "stream": True}
    with post(daemon, "/v1/completions", json=body, stream=True) as answer:
        lines = [line for line in answer.iter_lines() if line]
    assert json.loads(lines[0].removeprefix(b"data: "))["choices"][0]["text"] == "hello"
    assert lines[-1] == b"data: [DONE]"
    error = json.loads(lines[-2].removeprefix(b"data: "))["error"]
    assert error["message"] == "RuntimeError: the step broke", error
    assert error["type"] == "server_error"
    whole = post(daemon, "/v1/completions", json={**body, "stream": False})  # the worker lives
    assert whole.status_code == 500 and whole.json()["error"]["message"] == (
        "RuntimeError: the step broke")
