"""The inference server refuses new predictions while its event loop runs behind."""

from __future__ import annotations

import asyncio
import time

import pytest

from mservd.frontends.http.shedding import FLOOR, ModelLimit, Overloaded, Shedder


def test_a_loop_running_behind_sheds_and_a_caught_up_one_does_not() -> None:
    loop = asyncio.new_event_loop()
    try:
        shedder = Shedder(20, loop)
        shedder.busy = 32  # predictions in flight: the lag is theirs
        loop.run_until_complete(asyncio.sleep(0.05))
        shedder.check()  # an idle loop is on time

        async def block() -> None:
            for _ in range(12):
                time.sleep(0.06)  # CPU-bound work holding the loop, turn after turn
                await asyncio.sleep(0)

        loop.run_until_complete(block())
        with pytest.raises(Overloaded, match="behind"):
            shedder.check()
        shedder.busy = 2
        shedder.check()  # few in flight: the lag is not theirs to shed
        shedder.busy = 32
        loop.run_until_complete(asyncio.sleep(0.3))
        shedder.check()  # caught up: predictions are taken again
    finally:
        loop.close()


def test_limit_zero_never_sheds() -> None:
    loop = asyncio.new_event_loop()
    try:
        shedder = Shedder(0, loop)
        shedder.lag = 10.0
        shedder.check()
    finally:
        loop.close()


def _limit_after(answers: list[float], wait: float = 0.05, seconds: float = 0.1) -> ModelLimit:
    """A limit that saw these answer times, spread evenly over ``seconds`` of 5 ms ticks."""
    limit = ModelLimit(wait)
    ticks = int(seconds / 0.005)
    per_tick = len(answers) / ticks
    done = 0.0
    for _ in range(ticks):
        done += per_tick
        while answers and done >= 1:
            limit.answered(answers.pop(0))
            done -= 1
        limit.tick(0.005)
    return limit


def test_a_model_answering_on_time_is_not_limited() -> None:
    limit = _limit_after([0.002] * 20 + [0.03] * 100)
    limit.busy = 500
    assert not limit.full(0.0)  # answers inside max_queue_wait_ms: a burst is let in


def test_a_late_model_may_have_in_flight_what_it_answers_in_a_third_of_the_wait() -> None:
    limit = _limit_after([0.002] * 20 + [0.08] * 80)  # 1,000 answers/s, lately all late
    limit.busy = 40
    assert limit.allowed(0.0) == 40  # late for a moment: it keeps what it has in flight
    assert limit.allowed(0.2) == 40
    share = limit.allowed(0.25)  # late for SUSTAIN on end: Little's share of the wait
    assert share == pytest.approx(1000 * 0.05 / 3, rel=0.05)
    limit.busy = int(share) - 1
    assert not limit.full(0.26)
    limit.busy = int(share) + 1
    assert limit.full(0.27)


def test_a_closed_loop_late_for_a_moment_is_not_cut() -> None:
    limit = _limit_after([0.002] * 20 + [0.08] * 80)
    limit.busy = 32  # every client of a closed loop has a request in flight
    assert limit.allowed(0.0) == 32
    limit.busy = 31  # one is answered: its client's next request is let in
    assert not limit.full(0.2)
    for _ in range(200):
        limit.answered(0.01)  # on time again before SUSTAIN
    assert limit.allowed(0.24) >= 32
    assert limit.allowed(3.0) == float("inf")  # and in a few seconds no limit at all


def test_a_limit_is_lifted_step_by_step_once_answers_are_on_time() -> None:
    limit = _limit_after([0.002] * 20 + [0.08] * 80)
    limit.allowed(10.0)
    share = limit.allowed(10.3)
    for _ in range(200):
        limit.answered(0.01)  # on time again
    assert limit.allowed(10.6) == pytest.approx(1.3 * share)
    assert limit.allowed(11.1) > 1.6 * share
    assert limit.allowed(13.1) == float("inf")


def test_a_model_left_idle_after_being_late_takes_the_next_burst() -> None:
    limit = _limit_after([0.002] * 20 + [0.08] * 80)
    limit.busy = 30
    limit.allowed(0.0)
    assert limit.allowed(0.3) < 30  # late on end: cut to its share
    limit.busy = 0
    for _ in range(100):  # half a second with nothing in flight
        limit.tick(0.005)
    limit.busy = 100
    assert not limit.full(5.0)  # a burst much later: let in


def test_a_limit_never_falls_below_its_floor() -> None:
    limit = _limit_after([0.002] + [0.2] * 10)
    assert limit.allowed(0.0) == FLOOR
    limit.busy = FLOOR - 1
    assert not limit.full(0.0)


def test_a_slow_model_is_left_to_the_controller() -> None:
    limit = _limit_after([0.4] * 100)  # its quickest answer is far past half the wait
    limit.busy = 1000
    assert limit.allowed(0.0) == float("inf") and not limit.full(0.0)


def test_a_model_s_quickest_answer_is_forgotten_slowly() -> None:
    limit = _limit_after([0.002] + [0.08] * 100)
    assert limit.quickest == pytest.approx(0.002, rel=0.05)  # load does not lift it
    for _ in range(200 * 60):  # a minute of ticks
        limit.tick(0.005)
    assert 0.0035 < limit.quickest < 0.004  # about 1 % a second
