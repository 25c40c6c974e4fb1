"""OpenAI's request bodies are checked once, in the frontend, and what the worker needs of
them travels as an OpenAIRequest the worker's codec reads without checking again."""

import json

import pytest

from mservd.errors import BadRequest
from mservd.openai_request import GENERATION_FIELDS, OpenAIRequest, parse


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_a_chat_request_forwards_only_the_fields_its_handler_reads() -> None:
    checked = parse("chat", body(model="m", messages=[{"role": "user", "content": "hi"}],
                                 prompt="dropped", max_completion_tokens=5, temperature=0,
                                 stream=True, stream_options={"include_usage": True},
                                 user="someone"))
    again = OpenAIRequest.from_payload(checked.payload())
    assert again == checked
    assert (again.kind, again.model, again.stream, again.include_usage) == ("chat", "m", True,
                                                                            True)
    assert again.body == {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                          "temperature": 0}
    assert set(again.body) <= set(GENERATION_FIELDS)


def test_a_completion_keeps_its_prompt_and_drops_messages() -> None:
    checked = parse("completion", body(model="m", prompt="Once", messages=[], stop="\n"))
    assert checked.body == {"prompt": "Once", "stop": "\n"}


def test_an_embedding_request_carries_its_texts_a_single_string_as_one() -> None:
    assert parse("embedding", body(model="e", input="one")).texts == ["one"]
    assert parse("embedding", body(model="e", input=["a", "b"])).texts == ["a", "b"]


@pytest.mark.parametrize(("kind", "fields", "named"), [
    ("chat", {"model": "m"}, '"messages"'),
    ("chat", {"model": "m", "messages": [{"role": "user"}], "top_p": 0}, '"top_p"'),
    ("completion", {"model": "m", "prompt": "x", "max_tokens": 0}, '"max_tokens"'),
    ("completion", {"model": "m", "prompt": "x", "stream": "yes"}, '"stream"'),
    ("completion", {"prompt": "x"}, '"model"'),
    ("embedding", {"model": "e", "input": [1, 2]}, '"input"'),
    ("embedding", {"model": "e"}, '"input"'),
])
def test_a_bad_field_is_refused_naming_it(kind: str, fields: dict, named: str) -> None:
    with pytest.raises(BadRequest, match=named):
        parse(kind, body(**fields))


def test_a_payload_that_is_no_forwarded_request_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="as the frontend forwards it"):
        OpenAIRequest.from_payload(b'{"model": "m", "messages": []}')
