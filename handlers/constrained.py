"""Constrained decoding: a sequence whose tokens must spell a grammar's text (structured
output's JSON schema, a forced tool call), with llguidance.

llguidance (the grammar engine of Guidance, also in vLLM, SGLang and llama.cpp) was chosen
over xgrammar and outlines-core by measuring the three on SmolLM2-135M's 49,152-token
vocabulary on a 2-core CPU (docs in BENCHMARKS.md, "Constrained decoding"): its mask costs
~0.02 ms a token (xgrammar's ~0.005 ms, from its cache, but applying xgrammar's mask to the
logits ~0.25 ms), a grammar compiles in ~1 ms (outlines-core builds a regex index per schema:
~200 ms), it is one wheel with no dependencies (xgrammar brings apache-tvm-ffi), and its Lark
grammars embed JSON schemas (``%json{...}``), which the tool calls' framing needs.

One :class:`Grammars` per handler builds llguidance's view of the tokenizer once, on the first
request that needs it (~0.3 s); one :class:`Constraint` per constrained sequence masks the
logits of each step to the tokens the grammar allows next and follows the tokens picked. A
sequence that is not constrained is never touched. JSON is written compactly (``", "`` and
``": "`` between items, no other whitespace), so that a small model cannot spend its tokens on
blank space. llguidance is imported lazily: the handler runs without it (on TorchServe, say),
and a request that needs it is refused (:class:`GrammarError`). Imports nothing of mservd.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import torch

# compact JSON: no whitespace but one space after each comma and colon
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# a schema's keywords whose value maps names to schemas
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


class GrammarError(ValueError):
    """A grammar that cannot be served: llguidance is missing, or the schema is not one it
    can follow (the message says which)."""


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """The grammar of JSON text valid against ``schema``, written compactly."""
    return json.dumps({"grammars": [{"json_schema": {**closed(schema),
                                                     "x-guidance": JSON_STYLE}}]})


def lark_json(schema: dict[str, Any]) -> str:
    """A Lark rule's body for a JSON value valid against ``schema`` (for :func:`lark`)."""
    return "%json" + json.dumps({**closed(schema), "x-guidance": JSON_STYLE})


def closed(schema: Any) -> Any:
    """``schema`` with each object that lists its ``properties`` and says nothing of others
    closed to them (``additionalProperties: false``, which OpenAI's strict mode asks of every
    object): what follows it still validates against ``schema``, and a small model cannot
    wander off into properties of its own until ``max_tokens`` cuts the answer."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):  # names to schemas
            out[key] = {name: closed(item) for name, item in value.items()}
        elif key in ("const", "enum", "default", "examples"):  # values, not schemas
            out[key] = value
        else:
            out[key] = closed(value)
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema \
            and "patternProperties" not in schema:
        out["additionalProperties"] = False
    return out


def lark(grammar: str) -> str:
    """A grammar written in llguidance's Lark dialect."""
    return json.dumps({"grammars": [{"lark_grammar": grammar}]})


class Grammars:
    """The handler's grammar engine: llguidance's tokenizer, made once, and the constraints."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll_tokenizer: Any = None
        self._lock = threading.Lock()  # requests are read on a thread of their own

    def constraint(self, grammar: str, what: str) -> Constraint:
        """A fresh constraint following ``grammar`` (from :func:`json_schema_grammar` or
        :func:`lark`); ``what`` names the field it comes from, for the error.

        :raises GrammarError: llguidance is not installed, or the grammar is not valid.
        """
        try:
            import llguidance
        except ImportError:
            raise GrammarError(f'"{what}" needs constrained decoding, and this worker has no '
                               "llguidance (pip install llguidance).") from None
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                self._ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer,
                                                                  n_vocab=self.vocab_size)
        error = llguidance.LLMatcher.validate_grammar(grammar, self._ll_tokenizer)
        if error:
            raise GrammarError(f'"{what}" cannot be followed: {error}')
        matcher = llguidance.LLMatcher(self._ll_tokenizer, grammar)
        if matcher.is_error():
            raise GrammarError(f'"{what}" cannot be followed: {matcher.get_error()}')
        return Constraint(matcher, self.vocab_size)


class Constraint:
    """One sequence's grammar state: which tokens may come next."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with every token the grammar rules out at -inf (a new tensor)."""
        return apply_bitmask(self.matcher.compute_bitmask(), logits)

    def accept(self, token: int) -> None:
        """Follow a picked token (one the mask allowed)."""
        if not self.matcher.consume_token(token):
            raise GrammarError(f"token {token} does not follow the grammar: "
                               f"{self.matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar's text is whole: nothing but the end may follow."""
        return bool(self.matcher.is_stopped())


def apply_bitmask(bitmask: bytes, logits: torch.Tensor) -> torch.Tensor:
    """``logits`` with the tokens whose bit is 0 in llguidance's ``bitmask`` at -inf."""
    bits = np.frombuffer(bitmask, dtype=np.uint8)
    allowed = np.unpackbits(bits, bitorder="little")[:logits.shape[-1]].astype(bool)
    return logits.masked_fill(~torch.from_numpy(allowed).to(logits.device), float("-inf"))
