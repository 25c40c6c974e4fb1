"""Several choices of one OpenAI request, each answered by its own worker request, merged
into one answer: whole, or streamed events re-indexed with one usage chunk and one [DONE]."""

import json

from mservd.frontends.http.openai_choices import merged_whole, rewritten


def whole(text: str, prompt: int, completion: int, id_: str = "cmpl-x") -> bytes:
    return json.dumps({"id": id_, "object": "text_completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}}).encode()


def test_whole_answers_list_their_choices_and_count_each_prompt_once() -> None:
    merged = json.loads(merged_whole([whole("a", 4, 2, "cmpl-1"), whole("b", 4, 3),
                                      whole("c", 6, 1), whole("d", 6, 5)], n=2))
    assert merged["id"] == "cmpl-1"
    assert [(c["index"], c["text"]) for c in merged["choices"]] == [
        (0, "a"), (1, "b"), (2, "c"), (3, "d")]
    assert merged["usage"] == {"prompt_tokens": 10, "completion_tokens": 11,
                               "total_tokens": 21}


def event(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def test_streamed_chunks_take_their_choices_index_and_the_first_id() -> None:
    usage: dict = dict.fromkeys(("prompt_tokens", "completion_tokens", "total_tokens"), 0)
    envelope: dict = {}
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
             "usage": None}
    first = rewritten(0, event(chunk), 2, False, usage, envelope)
    other = {**chunk, "id": "chatcmpl-2"}
    last = rewritten(1, event(other) + event({**other, "choices": [], "usage": {
        "prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}) + b"data: [DONE]\n\n",
        2, False, usage, envelope)
    docs = [json.loads(e[6:]) for e in first + last]
    assert [(d["id"], d["choices"][0]["index"]) for d in docs] == [
        ("chatcmpl-1", 0), ("chatcmpl-1", 1)]
    assert all("usage" not in d for d in docs)  # not asked for
    assert usage == {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1}
    error = b'data: {"error": {"message": "x", "type": "server_error"}}\n\n'
    assert rewritten(1, error + b"data: [DONE]\n\n", 2, True, usage, envelope) == [error]
