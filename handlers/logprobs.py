"""The log-probabilities of a sequence's tokens, for OpenAI's ``logprobs``.

Computed from the distribution the token is picked from: the model's logits after the
request's ``logit_bias`` and penalties, its grammar's mask (structured output) and its
temperature, before ``top_p`` (at temperature 0, whose pick is the likeliest token, the
temperature is taken as 1: the model's own distribution). A token a grammar rules out has
the log-probability -9999 (OpenAI's own floor), so that every value is a JSON number.

Each entry is chat's shape, ``{token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}``, with ``text_offset`` (where its text begins in the answer, in characters) for
completions' shape; the worker's codec writes the shape of the request's endpoint. A token is
the text of its bytes (``bytes``: its UTF-8 bytes, which a character split across tokens
needs). It imports nothing of mservd and is shipped beside ``causal_lm.py`` in the archive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

FLOOR = -9999.0  # the log-probability of a token that cannot be picked, as OpenAI writes it


@dataclass
class Entry:
    """One generated token's log-probability and its alternatives, and where its text is."""

    token: int
    logprob: float
    top: list[tuple[int, float]]
    start: int = 0  # its text in the answer: [start, end) in characters
    end: int = 0


@dataclass
class Recorder:
    """One sequence's entries: recorded when a token is picked, sent when its text is."""

    top: int  # how many alternatives each entry lists
    pending: list[Entry] = field(default_factory=list)

    def record(self, logits: torch.Tensor, token: int) -> None:
        """The entry of ``token``, picked from ``logits`` (already shaped and scaled)."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        top: list[tuple[int, float]] = []
        if self.top:
            values, ids = torch.topk(logprobs, self.top)
            top = [(int(i), _finite(float(v))) for v, i in zip(values, ids)]
        self.pending.append(Entry(token, _finite(float(logprobs[token])), top))


class Vocabulary:
    """Each token's text and bytes, computed once per token id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.byte_level = _byte_decoder() if _is_byte_level(tokenizer) else None
        self.known: dict[int, tuple[str, list[int]]] = {}

    def of(self, token: int) -> tuple[str, list[int]]:
        found = self.known.get(token)
        if found is None:
            raw = self.raw_bytes(token)
            found = self.known[token] = (raw.decode("utf-8", "replace"), list(raw))
        return found

    def raw_bytes(self, token: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if self.byte_level is not None and all(c in self.byte_level for c in piece):
            return bytes(self.byte_level[c] for c in piece)  # GPT-2's byte-level BPE
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])  # SentencePiece's byte fallback
        return self.tokenizer.decode([token]).encode("utf-8")

    def entry(self, entry: Entry) -> dict[str, Any]:
        """An entry as the handler answers it: chat's shape, with ``text_offset``."""
        text, raw = self.of(entry.token)
        top = []
        for token, logprob in entry.top:
            alt_text, alt_raw = self.of(token)
            top.append({"token": alt_text, "logprob": logprob, "bytes": alt_raw})
        return {"token": text, "logprob": entry.logprob, "bytes": raw, "top_logprobs": top,
                "text_offset": entry.start}


def _finite(value: float) -> float:
    return max(FLOOR, value)


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel"


def _byte_decoder() -> dict[str, int]:
    """GPT-2's map of the characters byte-level BPE writes bytes as, back to the bytes."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}
