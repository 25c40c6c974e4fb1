"""The causal LM handler's OpenAI fields, on the real SmolLM2 sample, driven as the continuous
loop drives it: ``logit_bias`` and the penalties (OpenAI's formula, per sequence),
``logprobs`` (from the distribution the token is picked from, lined up with the text a stop
string cuts), ``response_format`` (constrained decoding: the answer validates; the other
sequences of the step are untouched) and tools (forced calls, the answer read into calls).
The helpers are the step tests' (test_causal_lm_step.py)."""

from __future__ import annotations

import json
import sys
from typing import Any

import jsonschema
import pytest
import torch
from test_causal_lm_step import handler, model_dir, run  # noqa: F401 (a fixture)

from handlers import tool_calls
from handlers.errors import RequestError
from handlers.logit_rules import LogitRules

PROMPT = "The capital of France is"
CAT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                        "age": {"type": "integer"}},
       "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}


@pytest.fixture(scope="module")
def lm(model_dir):  # noqa: F811 (the step tests' fixture)
    return handler(model_dir)


def answer(lm: Any, body: dict[str, Any]) -> tuple[str, list[Any]]:
    """One request to its end: its text and each step's output."""
    steps: list[dict[str, Any]] = []
    text = run(lm[0], lm[1], [{"body": body}], steps)["r0"]
    return text, [s["r0"] for s in steps if "r0" in s]


def greedy(lm: Any, prompt: str, count: int,
           shape=lambda logits, generated: logits) -> tuple[list[int], list[torch.Tensor]]:
    """The reference: ``count`` greedy tokens by full forward passes, each pick's logits
    shaped by ``shape(logits, generated)``; the tokens and the shaped logits."""
    model, tokenizer = lm[0].model, lm[0].tokenizer
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    tokens: list[int] = []
    shaped: list[torch.Tensor] = []
    with torch.no_grad():
        for _ in range(count):
            logits = model(torch.cat([ids, torch.tensor([tokens], dtype=torch.long)], 1)
                           if tokens else ids).logits[0, -1].float()
            logits = shape(logits, tokens)
            shaped.append(logits)
            tokens.append(int(torch.argmax(logits)))
    return tokens, shaped


# -- logit_bias and penalties -------------------------------------------------------------

def test_logit_rules_follow_openais_formula() -> None:
    rules = LogitRules(presence=0.5, frequency=0.25, bias={3: 2.0, 7: -100.0})
    for token in (3, 3, 5):
        rules.observe(token)
    out = rules.apply(torch.zeros(10))
    expected = torch.zeros(10)
    expected[3] = 2.0 - 2 * 0.25 - 0.5
    expected[5] = -0.25 - 0.5
    expected[7] = -100.0
    assert torch.equal(out, expected)


def test_penalties_and_bias_give_the_greedy_tokens_of_the_shaped_logits(lm) -> None:
    """Greedy picks with penalties and a bias are the argmax of OpenAI's formula applied to
    the model's logits, with counts of the answer's own tokens (not the prompt's)."""
    first = greedy(lm, PROMPT, 1)[0][0]
    presence, frequency, bias = 0.7, 1.3, {first: -5.0}

    def shape(logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
        logits = logits.clone()
        logits[first] += bias[first]
        for token in set(generated):
            logits[token] -= generated.count(token) * frequency + presence
        return logits

    tokens, _ = greedy(lm, PROMPT, 12, shape)
    text, _ = answer(lm, {"prompt": PROMPT, "max_tokens": 12, "presence_penalty": presence,
                          "frequency_penalty": frequency,
                          "logit_bias": {str(first): bias[first]}})
    assert text == lm[0].tokenizer.decode(tokens, skip_special_tokens=True)
    assert text != answer(lm, {"prompt": PROMPT, "max_tokens": 12})[0]


def test_a_bias_of_minus_100_bans_a_token_and_plus_100_forces_it(lm) -> None:
    tokenizer = lm[0].tokenizer
    plain, _ = answer(lm, {"prompt": PROMPT, "max_tokens": 6})
    banned = tokenizer(plain)["input_ids"][0]
    text, _ = answer(lm, {"prompt": PROMPT, "max_tokens": 6,
                          "logit_bias": {str(banned): -100}})
    assert banned not in tokenizer(text)["input_ids"]
    forced = tokenizer(" banana")["input_ids"][0]
    text, _ = answer(lm, {"prompt": PROMPT, "max_tokens": 3, "logit_bias": {str(forced): 100}})
    assert text == tokenizer.decode([forced] * 3)


@pytest.mark.parametrize(("body", "words"), [
    ({"logit_bias": {"49152": 1}}, '"logit_bias" names token 49152, which is not in this'),
    ({"logit_bias": {"5": 101}}, '"logit_bias" gives token 5 101; the values are from -100'),
    ({"presence_penalty": 2.5}, '"presence_penalty" must be a number from -2 to 2, got 2.5'),
    ({"frequency_penalty": "a"}, '"frequency_penalty" must be a number from -2 to 2.'),
], ids=["bias-token", "bias-value", "presence", "frequency"])
def test_a_bad_penalty_or_bias_is_refused_naming_it(lm, body, words) -> None:
    text = run(lm[0], lm[1], [{"body": {"prompt": PROMPT, **body}}])["r0"]
    assert isinstance(text, RequestError) and text.status == 400
    assert text.message.startswith(words)


# -- logprobs ------------------------------------------------------------------------------

def entries(steps: list[Any]) -> list[dict[str, Any]]:
    return [e for out in steps for e in (getattr(out, "logprobs", None) or [])]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_are_the_picked_distributions_and_spell_the_answer(lm, temperature) -> None:
    text, steps = answer(lm, {"prompt": PROMPT, "max_tokens": 8, "logprobs": True,
                              "top_logprobs": 3, "temperature": temperature, "seed": 1})
    got = entries(steps)
    assert "".join(e["token"] for e in got) == text
    assert [e["text_offset"] for e in got] == [
        sum(len(e["token"]) for e in got[:i]) for i in range(len(got))]
    tokens = lm[0].tokenizer(text)["input_ids"]
    _, logits = greedy(lm, PROMPT, 1)
    expected = torch.log_softmax(logits[0] / (temperature or 1.0), -1)
    first = got[0]
    assert first["logprob"] == pytest.approx(float(expected[tokens[0]]), abs=1e-4)
    values, ids = torch.topk(expected, 3)
    assert [a["logprob"] for a in first["top_logprobs"]] == pytest.approx(values.tolist(),
                                                                          abs=1e-4)
    assert [a["token"] for a in first["top_logprobs"]] == [
        lm[0].tokenizer.decode([i]) for i in ids.tolist()]
    assert first["bytes"] == list(first["token"].encode())
    if temperature == 0:
        assert all(e["logprob"] == e["top_logprobs"][0]["logprob"] for e in got)


def test_logprobs_leave_out_a_stop_strings_tokens_and_go_out_with_their_text(lm) -> None:
    plain, _ = answer(lm, {"prompt": PROMPT, "max_tokens": 10})
    stop = plain[len(plain) // 2:len(plain) // 2 + 3]
    text, steps = answer(lm, {"prompt": PROMPT, "max_tokens": 10, "stop": [stop],
                              "logprobs": True})
    assert text == plain[:plain.index(stop)]
    got = entries(steps)
    assert "".join(e["token"] for e in got).startswith(text)
    assert all(e["text_offset"] < len(text) for e in got)
    sent = ""
    for out in steps:  # each token's entry goes out with (the end of) its text, not before
        sent += str(out)
        for e in getattr(out, "logprobs", None) or []:
            assert len(sent) >= min(len(text), e["text_offset"] + len(e["token"]))


def test_completions_logprobs_count_the_alternatives(lm) -> None:
    _, steps = answer(lm, {"kind": "completion", "prompt": PROMPT, "max_tokens": 3,
                           "logprobs": 0})
    assert [len(e["top_logprobs"]) for e in entries(steps)] == [0, 0, 0]
    _, steps = answer(lm, {"prompt": PROMPT, "max_tokens": 3})
    assert all(getattr(out, "logprobs", None) is None for out in steps)


# -- structured output ---------------------------------------------------------------------

def chat(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema,
                                                   "strict": True}}


def test_a_json_schema_answer_validates_and_ends_at_the_grammars_end(lm) -> None:
    text, steps = answer(lm, {"messages": chat("Describe a cat as JSON."), "max_tokens": 80,
                              "response_format": schema_format(CAT)})
    jsonschema.validate(json.loads(text), CAT)
    assert steps[-1].finish_reason == "stop"


def test_a_json_object_answer_parses_and_max_tokens_still_bounds_it(lm) -> None:
    text, steps = answer(lm, {"messages": chat("Describe Paris in JSON."), "max_tokens": 120,
                              "response_format": {"type": "json_object"}})
    if steps[-1].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    cut, steps = answer(lm, {"messages": chat("Describe Paris in JSON."), "max_tokens": 4,
                             "response_format": {"type": "json_object"}})
    assert steps[-1].finish_reason == "length" and text.startswith(cut)


def test_a_constrained_sequence_leaves_the_others_of_its_step_as_they_are_alone(lm) -> None:
    plain = [{"body": {"prompt": f"Tell me about number {i}.", "max_tokens": 12}}
             for i in range(2)]
    alone = run(lm[0], lm[1], plain)
    constrained = {"body": {"messages": chat("A cat as JSON."), "max_tokens": 40,
                            "response_format": schema_format(CAT), "logprobs": True,
                            "presence_penalty": 1.0}}
    mixed = run(lm[0], lm[1], [plain[0], constrained, plain[1]])
    assert (mixed["r0"], mixed["r2"]) == (alone["r0"], alone["r1"])
    jsonschema.validate(json.loads(mixed["r1"]), CAT)


def test_structured_output_without_llguidance_is_refused_naming_the_field(
        model_dir, monkeypatch) -> None:  # noqa: F811
    lm, context, _ = handler(model_dir)
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance fails
    out = run(lm, context, [{"body": {"messages": chat("Hi"), "response_format": {
        "type": "json_object"}}}, {"body": {"prompt": PROMPT, "max_tokens": 3}}])
    assert isinstance(out["r0"], RequestError) and out["r0"].status == 400
    assert out["r0"].message.startswith('"response_format" needs constrained decoding')
    assert isinstance(out["r1"], str) and out["r1"]


def test_a_schema_the_grammar_cannot_follow_is_refused_naming_the_field(lm) -> None:
    out = run(lm[0], lm[1], [{"body": {"messages": chat("Hi"), "response_format":
                                       schema_format({"type": "wizard"})}}])["r0"]
    assert isinstance(out, RequestError) and out.status == 400
    assert out.message == '"response_format" cannot be followed: Invalid type: wizard'


# -- tools ---------------------------------------------------------------------------------

def calls_of(steps: list[Any]) -> list[dict[str, Any]]:
    """The tool calls of an answer's deltas, merged as a client merges them."""
    calls: list[dict[str, Any]] = []
    for out in steps:
        for delta in getattr(out, "tool_calls", None) or []:
            if "id" in delta:
                assert delta["index"] == len(calls) and delta["id"].startswith("call_")
                calls.append({"name": delta["function"]["name"], "arguments": ""})
            calls[delta["index"]]["arguments"] += delta["function"]["arguments"]
    return calls


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_time"}}])
def test_a_forced_tool_call_names_a_declared_function_with_valid_arguments(lm, choice) -> None:
    text, steps = answer(lm, {"messages": chat("What is the weather in Paris?"),
                              "tools": [WEATHER, TIME], "tool_choice": choice,
                              "parallel_tool_calls": False, "max_tokens": 60})
    calls = calls_of(steps)
    assert text == "" and len(calls) == 1 and steps[-1].finish_reason == "tool_calls"
    tool = {"get_weather": WEATHER, "get_time": TIME}[calls[0]["name"]]
    if isinstance(choice, dict):
        assert calls[0]["name"] == "get_time"
    jsonschema.validate(json.loads(calls[0]["arguments"]), tool["function"]["parameters"])


def test_tools_are_written_into_the_system_prompt_of_a_template_that_knows_none(lm) -> None:
    tokenizer = lm[0].tokenizer
    assert not tool_calls.knows_tools(tokenizer)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {
                        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    rendered, tools = tool_calls.render(messages, [WEATHER], native=False)
    assert tools is None
    assert rendered[0]["content"].startswith("Be brief.\n\n# Tools\n")
    assert json.dumps(WEATHER) in rendered[0]["content"]
    assert rendered[2]["content"] == ('<tool_call>\n{"name": "get_weather", "arguments": '
                                      '{"city": "Paris"}}\n</tool_call>')
    assert rendered[3] == {"role": "user",
                           "content": "<tool_response>\nSunny, 21 C\n</tool_response>"}
    text, _ = answer(lm, {"messages": messages, "tools": [WEATHER], "max_tokens": 8})
    assert isinstance(text, str)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_the_parser_splits_content_and_calls_alike_whatever_the_pieces(size) -> None:
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
            '"Pa}ris", "n": {"a": 1}}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
            '"arguments": {}}\n</tool_call>')
    parser = tool_calls.Parser()
    outs = [parser.feed(text[i:i + size], False) for i in range(0, len(text), size)]
    outs.append(parser.feed("", True))
    assert "".join(c for c, _ in outs) == "Let me check."

    class Out:
        def __init__(self, calls):
            self.tool_calls = calls

    assert calls_of([Out(d) for _, d in outs]) == [
        {"name": "get_weather", "arguments": '{"city": "Pa}ris", "n": {"a": 1}}'},
        {"name": "get_time", "arguments": "{}"}]


def test_text_that_opens_no_real_call_stays_content() -> None:
    parser = tool_calls.Parser()
    assert parser.feed("a <tool_call> b", False) == ("a", [])
    assert parser.feed("", True) == (" <tool_call> b", [])
