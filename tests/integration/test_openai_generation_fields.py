"""OpenAI's generation fields (issue 48), end to end against the SmolLM2 sample with the real
``openai`` client, streamed and not: ``logprobs`` in chat's and completions' shapes,
``logit_bias`` and the penalties, ``response_format`` (json_object and json_schema, validated
with ``jsonschema``; ``client.beta.chat.completions.parse``), tools (forced and named calls,
streamed as OpenAI streams them, and the follow-up with the tool's answer), and LangChain's
``ChatOpenAI`` (invoke, stream, bind_tools, with_structured_output)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

HELLO = [{"role": "user", "content": "Say hello."}]
CAT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                        "age": {"type": "integer"}},
       "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, store):
    from conftest import Daemon

    daemon = Daemon(tmp_path_factory.mktemp("openai-generation-fields"), store,
                    {"load_models": "smollm2.mar"})
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon) -> openai.OpenAI:
    return daemon.openai_client()


def chat(client, messages=HELLO, **kwargs):
    return client.chat.completions.create(model="smollm2", messages=messages, **kwargs)


def streamed(client, **kwargs) -> dict:
    """A streamed chat's pieces put together: text, logprobs, tool calls, finish reason."""
    text, entries, calls, reason = "", [], [], None
    for chunk in chat(client, stream=True, **kwargs):
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        if choice.logprobs is not None:
            entries += choice.logprobs.content or []
        for call in choice.delta.tool_calls or []:
            if call.id is not None:
                assert call.index == len(calls) and call.type == "function"
                calls.append({"id": call.id, "name": call.function.name, "arguments": ""})
            calls[call.index]["arguments"] += call.function.arguments or ""
        reason = choice.finish_reason or reason
    return {"text": text, "entries": entries, "calls": calls, "reason": reason}


# -- logprobs ------------------------------------------------------------------------------

def test_chat_logprobs_stream_and_answer_alike(client) -> None:
    whole = chat(client, max_tokens=8, logprobs=True, top_logprobs=2)
    content = whole.choices[0].logprobs.content
    assert "".join(e.token for e in content) == whole.choices[0].message.content
    assert all(len(e.top_logprobs) == 2 and e.logprob == e.top_logprobs[0].logprob
               and e.bytes == list(e.token.encode()) for e in content)  # greedy: the likeliest
    parts = streamed(client, max_tokens=8, logprobs=True, top_logprobs=2)
    assert parts["text"] == whole.choices[0].message.content
    assert [e.token for e in parts["entries"]] == [e.token for e in content]
    assert [e.logprob for e in parts["entries"]] == pytest.approx(  # a step's batch shape
        [e.logprob for e in content], abs=1e-4)  # moves float32 sums by a few ulps
    assert chat(client, max_tokens=2).choices[0].logprobs is None


def test_completions_logprobs_have_completions_shape(client) -> None:
    kwargs = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 6,
              "logprobs": 2}
    whole = client.completions.create(**kwargs).choices[0]
    lp = whole.logprobs
    assert "".join(lp.tokens) == whole.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(top) >= 2 and top[token] == logprob
               for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs))
    tokens = []
    for chunk in client.completions.create(stream=True, **kwargs):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens
    assert tokens == lp.tokens


# -- logit_bias and penalties -------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(store, tmp_path_factory):
    import zipfile

    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    with zipfile.ZipFile(store / "smollm2.mar") as archive:
        for name in archive.namelist():
            if name.startswith(("tokenizer", "special_tokens", "chat_template")):
                archive.extract(name, folder)
    return AutoTokenizer.from_pretrained(folder)


def test_logit_bias_bans_and_forces_tokens_streamed_and_not(client, tokenizer) -> None:
    plain = chat(client, max_tokens=6).choices[0].message.content
    first = tokenizer(plain)["input_ids"][0]
    banned = chat(client, max_tokens=6, logit_bias={str(first): -100}).choices[0]
    assert first not in tokenizer(banned.message.content)["input_ids"]
    forced = tokenizer(" banana")["input_ids"][0]
    whole = chat(client, max_tokens=3, logit_bias={str(forced): 100}).choices[0]
    assert whole.message.content == tokenizer.decode([forced] * 3)
    assert streamed(client, max_tokens=3, logit_bias={str(forced): 100})["text"] == \
        whole.message.content


def test_penalties_change_a_repetitive_greedy_answer_alike_streamed_and_not(client) -> None:
    ask = [{"role": "user", "content": "Write the word 'cat' twenty times."}]
    plain = chat(client, messages=ask, max_tokens=30).choices[0].message.content
    whole = chat(client, messages=ask, max_tokens=30, frequency_penalty=2.0,
                 presence_penalty=1.0).choices[0].message.content
    assert whole != plain
    assert streamed(client, messages=ask, max_tokens=30, frequency_penalty=2.0,
                    presence_penalty=1.0)["text"] == whole


def test_a_token_out_of_the_vocabulary_is_a_400_naming_logit_bias(client) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, max_tokens=2, logit_bias={"999999": 5})
    assert caught.value.body["param"] == "logit_bias"
    assert "not in this model's vocabulary" in caught.value.body["message"]


# -- structured output ---------------------------------------------------------------------

def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema,
                                                   "strict": True}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_json_schema_answer_validates(client, stream) -> None:
    ask = [{"role": "user", "content": "Describe a cat named Tom as JSON."}]
    if stream:
        parts = streamed(client, messages=ask, max_tokens=80,
                         response_format=schema_format(CAT))
        text, reason = parts["text"], parts["reason"]
    else:
        choice = chat(client, messages=ask, max_tokens=80,
                      response_format=schema_format(CAT)).choices[0]
        text, reason = choice.message.content, choice.finish_reason
    jsonschema.validate(json.loads(text), CAT)
    assert reason == "stop"


def test_json_object_parses_and_the_client_parses_a_pydantic_answer(client) -> None:
    import pydantic

    class Cat(pydantic.BaseModel):
        name: str
        age: int

    parsed = client.beta.chat.completions.parse(
        model="smollm2", messages=[{"role": "user", "content": "A cat as JSON."}],
        response_format=Cat, max_tokens=80)
    assert isinstance(parsed.choices[0].message.parsed, Cat)
    answer = chat(client, messages=[{"role": "user", "content": "Paris as JSON."}],
                  max_tokens=150, response_format={"type": "json_object"}).choices[0]
    if answer.finish_reason == "stop":
        assert isinstance(json.loads(answer.message.content), dict)
    else:
        assert answer.finish_reason == "length"


# -- tools ---------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_a_forced_tool_call_comes_back_as_tool_calls(client, choice, stream) -> None:
    kwargs = {"messages": ASK_WEATHER, "tools": [WEATHER], "tool_choice": choice,
              "parallel_tool_calls": False, "max_tokens": 60}
    if stream:
        parts = streamed(client, **kwargs)
        calls, reason, text = parts["calls"], parts["reason"], parts["text"]
    else:
        choice_ = chat(client, **kwargs).choices[0]
        message = choice_.message
        assert message.content is None
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in message.tool_calls]
        reason, text = choice_.finish_reason, ""
    assert reason == "tool_calls" and text == "" and len(calls) == 1
    assert calls[0]["id"].startswith("call_") and calls[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])


def test_the_tools_answer_goes_back_through_the_template(client) -> None:
    first = chat(client, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required",
                 parallel_tool_calls=False, max_tokens=60).choices[0].message
    call = first.tool_calls[0]
    follow = chat(client, tools=[WEATHER], max_tokens=30, messages=[
        *ASK_WEATHER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny and 21 degrees."}])
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert follow.usage.prompt_tokens > 100  # the tools and the call were rendered


def test_auto_and_none_answer_text_or_calls(client) -> None:
    auto = chat(client, messages=ASK_WEATHER, tools=[WEATHER], max_tokens=40).choices[0]
    if auto.finish_reason == "tool_calls":
        for call in auto.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments),
                                WEATHER["function"]["parameters"])
    else:
        assert auto.message.content and not auto.message.tool_calls
    none = chat(client, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="none",
                max_tokens=20).choices[0]
    assert none.message.tool_calls is None and none.finish_reason in ("stop", "length")


# -- LangChain -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def langchain_chat(daemon):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(
        model="smollm2", base_url=daemon.url("inference", "/v1"),
        api_key=daemon.key("inference") or "none", max_tokens=60, temperature=0)


def test_langchain_invokes_streams_binds_tools_and_structures_output(langchain_chat) -> None:
    import pydantic

    said = langchain_chat.invoke("Say hello.")
    assert said.content
    assert "".join(c.content for c in langchain_chat.stream("Say hello.")) == said.content

    class Weather(pydantic.BaseModel):
        """The current weather in a city."""

        city: str

    bound = langchain_chat.bind_tools([Weather], tool_choice="Weather")
    message = bound.invoke("What is the weather in Paris?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "Weather"
    assert isinstance(message.tool_calls[0]["args"]["city"], str)

    class Cat(pydantic.BaseModel):
        name: str
        age: int

    for method in ("json_schema", "function_calling"):
        cat = langchain_chat.with_structured_output(Cat, method=method).invoke(
            "A cat named Tom, age 3.")
        assert isinstance(cat, Cat)
