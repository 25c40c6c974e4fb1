"""Refusals that only make clients spin: counted against answers, window by window."""

from __future__ import annotations

from mservd.core.spinning import SPIN_FLOOR, SPIN_REST, WINDOW, Spin


def refuse(spin: Spin, count: int, start: float) -> None:
    for i in range(count):
        spin.refusal(start + i * WINDOW / (2 * count))


def test_refusals_far_faster_than_answers_make_it_rest_for_a_while() -> None:
    spin = Spin()
    spin.answers(5, 0.0)
    refuse(spin, SPIN_FLOOR, 0.0)  # a closed loop resending at once: 64 refusals to 5 answers
    assert spin.resting(WINDOW)  # judged when its window ends
    assert spin.resting(WINDOW + SPIN_REST - 0.01)
    assert not spin.resting(WINDOW + SPIN_REST + 0.01)


def test_an_open_overload_keeps_shedding() -> None:
    spin = Spin()
    spin.answers(SPIN_FLOOR, 0.0)  # offered 5x what it answers: 4 refusals per answer
    refuse(spin, 4 * SPIN_FLOOR, 0.0)
    assert not spin.resting(WINDOW)


def test_a_few_refusals_on_a_slow_model_are_no_spin() -> None:
    spin = Spin()
    refuse(spin, SPIN_FLOOR - 1, 0.0)  # nothing answered in the window, but few refused
    assert not spin.resting(WINDOW)
