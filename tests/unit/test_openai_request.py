"""OpenAI's request bodies are checked once, in the frontend, and what the worker needs of
them travels as an OpenAIRequest the worker's codec reads without checking again."""

import json

import pytest

from mservd.errors import BadRequest
from mservd.openai_request import (
    GENERATION_FIELDS,
    FieldError,
    OpenAIRequest,
    model_kind,
    parse,
    wrong_kind,
)


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
    assert again.body == {"kind": "chat", "messages": [{"role": "user", "content": "hi"}],
                          "max_tokens": 5, "temperature": 0}
    assert set(again.body) <= set(GENERATION_FIELDS)


def test_a_completion_keeps_its_prompt_and_drops_messages() -> None:
    checked = parse("completion", body(model="m", prompt="Once", messages=[], stop="\n"))
    assert checked.body == {"kind": "completion", "prompt": "Once", "stop": "\n"}


def test_an_embedding_request_carries_its_texts_a_single_string_as_one() -> None:
    assert parse("embedding", body(model="e", input="one")).texts == ["one"]
    assert parse("embedding", body(model="e", input=["a", "b"])).texts == ["a", "b"]


@pytest.mark.parametrize(("kind", "fields", "named"), [
    ("chat", {"model": "m"}, '"messages"'),
    ("chat", {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 0},
     '"top_p"'),
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


# -- round two (issue 48): what real clients send --------------------------------------------

def chat_body(**fields) -> bytes:
    return body(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def refused(kind: str, doc: bytes) -> FieldError:
    with pytest.raises(FieldError) as caught:
        parse(kind, doc)
    return caught.value


def test_null_is_the_field_absent_as_clients_serialise_their_defaults() -> None:
    checked = parse("completion", body(model="m", prompt="Hi", n=None, stream=None, seed=None,
                                       logprobs=None, stop=None, stream_options=None,
                                       temperature=None, suffix=None, echo=None))
    assert checked.body == {"kind": "completion", "prompt": "Hi"} and not checked.stream


def test_unknown_fields_are_ignored_and_known_unserved_ones_refused_by_name() -> None:
    assert parse("chat", chat_body(vendor_extra={"a": 1}, user="u", service_tier="auto",
                                   metadata={"k": "v"}, modalities=["text"])).body == {
        "kind": "chat", "messages": [{"role": "user", "content": "hi"}]}
    for field, value in [("audio", {"voice": "alloy"}), ("prediction", {"type": "content"}),
                         ("web_search_options", {}), ("functions", []),
                         ("function_call", "auto"), ("modalities", ["text", "audio"]),
                         ("reasoning_effort", "low"), ("store", True)]:
        error = refused("chat", chat_body(**{field: value}))
        assert (error.param, error.code) == (field, "unsupported_parameter"), field
    for field, value in [("echo", True), ("suffix", "end"), ("best_of", 3)]:
        assert refused("completion", body(model="m", prompt="x", **{field: value})).param == field


def test_roles_are_checked_and_named_by_their_message() -> None:
    error = refused("chat", body(model="m", messages=[
        {"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]))
    assert error.param == "messages[1].role" and "'wizard'" in error.message
    assert refused("chat", body(model="m", messages=[{"content": "b"}])).param == \
        "messages[0].role"


def test_text_parts_are_joined_and_other_parts_refused_naming_their_type() -> None:
    checked = parse("chat", body(model="m", messages=[
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "one"},
                                     {"type": "text", "text": "two"}], "name": "ann"}]))
    assert checked.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "one\ntwo", "name": "ann"}]
    error = refused("chat", body(model="m", messages=[{"role": "user", "content": [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "x"}}]}]))
    assert error.param == "messages[0].content[1].type" and "'image_url'" in error.message
    assert refused("chat", body(model="m", messages=[{"role": "user", "content": []}])).param \
        == "messages[0].content"


def test_tool_calls_and_tool_messages_are_forwarded() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    checked = parse("chat", body(model="m", messages=messages))
    assert checked.body["messages"] == messages
    assert refused("chat", body(model="m", messages=[{"role": "tool", "content": "x"}])).param \
        == "messages[0].tool_call_id"
    assert refused("chat", body(model="m", messages=[{"role": "user", "content": None}])).param \
        == "messages[0].content"
    assert refused("chat", body(model="m", messages=[
        {"role": "user", "content": "x", "tool_calls": [call]}])).param == "messages[0].tool_calls"


TOOL = {"type": "function", "function": {"name": "weather", "description": "The weather.",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"type": "string"}}}}}


def test_tools_and_tool_choice_are_checked_and_forwarded() -> None:
    named = {"type": "function", "function": {"name": "weather"}}
    checked = parse("chat", chat_body(tools=[TOOL], tool_choice=named, parallel_tool_calls=False))
    assert checked.body["tools"] == [TOOL]
    assert checked.body["tool_choice"] == named and checked.body["parallel_tool_calls"] is False
    for choice in ("none", "auto", "required"):
        assert parse("chat", chat_body(tools=[TOOL], tool_choice=choice)).body["tool_choice"] \
            == choice
    other = {"type": "function", "function": {"name": "stocks"}}
    assert "'stocks'" in refused("chat", chat_body(tools=[TOOL], tool_choice=other)).message
    assert refused("chat", chat_body(tool_choice="auto")).param == "tool_choice"
    assert refused("chat", chat_body(tool_choice="sometimes", tools=[TOOL])).param == \
        "tool_choice"
    assert refused("chat", chat_body(parallel_tool_calls=True)).param == "parallel_tool_calls"
    assert refused("chat", chat_body(tools=[{"type": "custom", "custom": {}}])).param == \
        "tools[0].type"
    bad_name = {"type": "function", "function": {"name": "no spaces"}}
    assert refused("chat", chat_body(tools=[bad_name])).param == "tools[0].function.name"
    assert refused("completion", body(model="m", prompt="x", tools=[TOOL])).param == "tools"


def test_logprobs_have_each_endpoints_shape() -> None:
    checked = parse("chat", chat_body(logprobs=True, top_logprobs=20))
    assert (checked.body["logprobs"], checked.body["top_logprobs"]) == (True, 20)
    assert refused("chat", chat_body(top_logprobs=2)).param == "top_logprobs"
    assert refused("chat", chat_body(logprobs=False, top_logprobs=2)).param == "top_logprobs"
    assert refused("chat", chat_body(logprobs=True, top_logprobs=21)).param == "top_logprobs"
    assert refused("chat", chat_body(logprobs=1)).param == "logprobs"
    assert parse("completion", body(model="m", prompt="x", logprobs=5)).body["logprobs"] == 5
    for bad in (6, -1, True):
        assert refused("completion", body(model="m", prompt="x", logprobs=bad)).param == \
            "logprobs"


def test_response_format_is_checked_text_dropped() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    checked = parse("chat", chat_body(response_format={
        "type": "json_schema", "json_schema": {"name": "answer", "schema": schema,
                                               "strict": True}}))
    assert checked.body["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "answer", "schema": schema,
                                               "strict": True}}
    assert parse("chat", chat_body(response_format={"type": "json_object"})).body[
        "response_format"] == {"type": "json_object"}
    assert "response_format" not in parse("chat", chat_body(
        response_format={"type": "text"})).body
    for bad, param in [({"type": "xml"}, "response_format"),
                       ({"type": "json_schema"}, "response_format.json_schema"),
                       ({"type": "json_schema", "json_schema": {"schema": schema}},
                        "response_format.json_schema.name"),
                       ({"type": "json_schema", "json_schema": {"name": "a"}},
                        "response_format.json_schema.schema"),
                       ({"type": "json_schema", "json_schema": {"name": "a", "schema": schema,
                                                                "strict": "yes"}},
                        "response_format.json_schema.strict")]:
        assert refused("chat", chat_body(response_format=bad)).param == param


def test_penalties_and_logit_bias_are_checked_and_forwarded() -> None:
    checked = parse("chat", chat_body(presence_penalty=-2, frequency_penalty=1.5,
                                      logit_bias={"50256": -100, "7": 3.5}))
    assert checked.body["presence_penalty"] == -2 and checked.body["frequency_penalty"] == 1.5
    assert checked.body["logit_bias"] == {"50256": -100, "7": 3.5}
    assert refused("chat", chat_body(presence_penalty=2.5)).param == "presence_penalty"
    assert refused("chat", chat_body(frequency_penalty="1")).param == "frequency_penalty"
    for bad in ({"x": 1}, {"1": 101}, {"1": True}, [1], {str(i): 1 for i in range(301)}):
        assert refused("chat", chat_body(logit_bias=bad)).param == "logit_bias"


def test_embedding_options_are_checked() -> None:
    checked = parse("embedding", body(model="e", input="x", encoding_format="base64",
                                      dimensions=128, user="u"))
    assert checked.options == {"encoding_format": "base64", "dimensions": 128}
    assert parse("embedding", body(model="e", input="x", encoding_format="float")).options == {}
    assert refused("embedding", body(model="e", input="x", encoding_format="hex")).param == \
        "encoding_format"
    assert refused("embedding", body(model="e", input="x", dimensions=0)).param == "dimensions"


@pytest.mark.parametrize(("handler", "settings", "kind"), [
    ("causal_lm", {}, "generation"), ("causal_lm.py", {}, "generation"),
    ("handlers/causal_lm.py:handle", {}, "generation"), ("text_embedder", {}, "embedding"),
    ("text_embedder.py", {}, "embedding"), ("mine.py", {}, None),
    ("mine.py", {"continuousBatching": True}, "generation"),
])
def test_a_models_kind_is_its_built_in_handlers(handler, settings, kind) -> None:
    assert model_kind(handler, settings) == kind


def test_an_endpoint_refuses_a_model_of_another_kind_naming_it() -> None:
    assert wrong_kind("embedding", "smollm2", "causal_lm.py", {}) == (
        "Model 'smollm2' is a generation model: it serves /v1/chat/completions and "
        "/v1/completions, not /v1/embeddings, which needs an embedding model.")
    assert "an embedding model" in wrong_kind("chat", "minilm", "text_embedder", {})
    assert wrong_kind("chat", "mine", "mine.py", {}) is None
    assert wrong_kind("embedding", "minilm", "text_embedder", {}) is None


def test_n_and_a_list_of_prompts_make_one_request_per_choice_in_openais_order() -> None:
    checked = parse("completion", body(model="m", prompt=["a", "b"], n=2, seed=5,
                                       max_tokens=3))
    assert [(c.body.get("prompt"), c.body["seed"], c.n) for c in checked.choices()] == [
        ("a", 5, 1), ("a", 6, 1), ("b", 5, 1), ("b", 6, 1)]
    ids = parse("completion", body(model="m", prompt=[[1, 2], [3]]))
    assert [c.body for c in ids.choices()] == [
        {"kind": "completion", "prompt_token_ids": [1, 2]},
        {"kind": "completion", "prompt_token_ids": [3]}]
    assert [c.body for c in parse("completion", body(model="m", prompt=[7, 8])).choices()] \
        == [{"kind": "completion", "prompt_token_ids": [7, 8]}]
    one = parse("completion", body(model="m", prompt=["only"]))
    assert [c.body["prompt"] for c in one.choices()] == ["only"]
    alone = parse("chat", chat_body(seed=1))
    assert alone.choices() == [alone]
    chats = parse("chat", chat_body(n=3)).choices()
    assert len(chats) == 3 and all("seed" not in c.body for c in chats)


def test_n_and_prompts_are_bounded() -> None:
    assert refused("chat", chat_body(n=9)).param == "n"
    assert refused("chat", chat_body(n=0)).param == "n"
    assert refused("completion", body(model="m", prompt=["x"] * 9, n=8)).param == "prompt"
    for bad in ([], [[]], ["a", 1], [[1, -2]], [True], 5):
        assert refused("completion", body(model="m", prompt=bad)).param == "prompt", bad
