"""Refusals that only make clients spin.

Shedding helps when refused clients go away or wait (``Retry-After``): the requests that stay
are answered in time. A closed loop — a fixed set of clients, each sending again at once — does
neither: every refusal comes straight back, so refusing it lowers no queue and only spends the
CPU the model needs on refusing, far faster than the model answers. Whoever sheds (the
controller for a latency target, a frontend holding the controller's refusal) counts its
refusals and the model's answers; refused more than SPIN_RATIO times as often as it answers, it rests
for SPIN_REST seconds and lets requests queue instead (job_queue_size still bounds them). An open
overload offering more than SPIN_RATIO + 1 times what the model answers looks the same, and is
treated the same. (The opt-in concurrency limit in ``frontends/http/shedding.py`` has its own
rule for spinning clients, against the capacity it measures per tick.)

Counting only, no clock of its own: the caller says when.
"""

from __future__ import annotations

WINDOW = 0.5  # seconds over which refusals and answers are compared: longer than a stall of
# the answers under an open overload, which also refuses more than it answers for a moment
SPIN_RATIO = 8.0  # refused this many times as often as answered: clients resending at once (an
# open overload of 1.8x refuses under twice what it answers; a closed loop spinning on a slow
# model, a hundred times) ...
SPIN_FLOOR = 64  # ... and at least this many refusals in a window (an open overload on a slow
# model refuses a few a window, whatever its ratio)
SPIN_REST = 5.0  # seconds it then rests


class Spin:
    """One model's refusals against its answers, window by window."""

    def __init__(self) -> None:
        self.refused = 0
        self.answered = 0
        self._started = 0.0
        self._calm_until = 0.0

    def resting(self, now: float) -> bool:
        """True while refusing would only make its clients spin."""
        self._roll(now)
        return now < self._calm_until

    def refusal(self, now: float) -> None:
        self._roll(now)
        self.refused += 1

    def answers(self, count: int, now: float) -> None:
        self._roll(now)
        self.answered += count

    def _roll(self, now: float) -> None:
        if now - self._started < WINDOW:
            return
        if self.refused >= SPIN_FLOOR and self.refused > SPIN_RATIO * self.answered:
            self._calm_until = now + SPIN_REST
        self.refused = self.answered = 0
        self._started = now
