"""What one request asks of each next token's logits before it is picked: ``logit_bias``,
``presence_penalty`` and ``frequency_penalty``, as OpenAI defines them.

One :class:`LogitRules` per sequence that sets any of them (the others are not touched, so
their tokens stay what they are alone); it imports nothing of mservd and is shipped beside
``causal_lm.py`` in the archive. OpenAI's formula, on the model's logits ``mu``, where
``c[j]`` is how often token ``j`` was generated so far in this answer (the prompt's tokens do
not count)::

    mu[j] = mu[j] + logit_bias[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty

before the temperature divides them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

MAX_PENALTY = 2.0  # OpenAI's bounds of both penalties
MAX_BIAS = 100.0  # and of each logit_bias value


class RuleError(ValueError):
    """A field of the three this module reads is out of its bounds; the message names it."""


class LogitRules:
    """One sequence's bias and penalties, and the counts of its tokens so far."""

    def __init__(self, presence: float, frequency: float, bias: dict[int, float]) -> None:
        self.presence = presence
        self.frequency = frequency
        self.bias_ids = torch.tensor(sorted(bias), dtype=torch.long)
        self.bias_values = torch.tensor([bias[i] for i in sorted(bias)], dtype=torch.float32)
        self.counts: Counter[int] = Counter()

    @classmethod
    def of(cls, request: dict[str, Any], vocab_size: int) -> LogitRules | None:
        """The rules a request's body asks for, or None when it asks for none (then its
        logits are the model's own).

        :raises RuleError: a value out of OpenAI's bounds, or a token id not in the vocabulary.
        """
        presence = _number(request, "presence_penalty", MAX_PENALTY)
        frequency = _number(request, "frequency_penalty", MAX_PENALTY)
        raw = request.get("logit_bias") or {}
        if not isinstance(raw, dict):
            raise RuleError('"logit_bias" must be an object of token ids to numbers from '
                            f"-{MAX_BIAS:g} to {MAX_BIAS:g}.")
        bias: dict[int, float] = {}
        for key, value in raw.items():
            try:
                token = int(key)
                number = float(value)
            except (TypeError, ValueError, OverflowError):
                raise RuleError(f'"logit_bias" maps {str(key)[:32]!r} to {str(value)[:32]!r}: '
                                "keys are token ids, values numbers.") from None
            if not 0 <= token < vocab_size:
                raise RuleError(f'"logit_bias" names token {token}, which is not in this '
                                f"model's vocabulary of {vocab_size} tokens.")
            if not -MAX_BIAS <= number <= MAX_BIAS:
                raise RuleError(f'"logit_bias" gives token {token} {number:g}; the values are '
                                f"from -{MAX_BIAS:g} to {MAX_BIAS:g}.")
            if number:
                bias[token] = number
        if not presence and not frequency and not bias:
            return None
        return cls(presence, frequency, bias)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits with the bias and penalties applied (a new tensor: the engine's row is
        left as it is)."""
        out = logits.float().clone()
        if len(self.bias_ids):
            out.index_add_(0, self.bias_ids.to(out.device), self.bias_values.to(out.device))
        if self.counts and (self.presence or self.frequency):
            ids = torch.tensor(list(self.counts), dtype=torch.long, device=out.device)
            counts = torch.tensor(list(self.counts.values()), dtype=torch.float32,
                                  device=out.device)
            out.index_add_(0, ids, -(counts * self.frequency + self.presence))
        return out

    def observe(self, token: int) -> None:
        """Count a generated token, for the penalties of the tokens after it."""
        self.counts[token] += 1


def _number(request: dict[str, Any], name: str, bound: float) -> float:
    value = request.get(name)
    if value is None:
        return 0.0
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise RuleError(f'"{name}" must be a number from -{bound:g} to {bound:g}.') from None
    if not -bound <= number <= bound:  # (a NaN is refused here too)
        raise RuleError(f'"{name}" must be a number from -{bound:g} to {bound:g}, got '
                        f"{number:g}.")
    return number
