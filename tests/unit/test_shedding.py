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


def _limit_after(answers: list[float], wait: float = 0.05, seconds: float = 1.0) -> ModelLimit:
    """A limit that saw these answer times, spread evenly over ``seconds`` of 5 ms ticks."""
    limit = ModelLimit(wait)
    ticks = int(seconds / 0.005)
    per_tick = len(answers) / ticks
    done = 0.0
    for tick in range(ticks):
        done += per_tick
        while answers and done >= 1:
            limit.answered(answers.pop(0))
            done -= 1
        limit.tick(0.005)
    return limit


def test_a_model_answering_on_time_is_never_limited() -> None:
    limit = _limit_after([0.002] * 20 + [0.03] * 1000)
    limit.busy = 500
    assert not limit.full()  # answers come back inside max_queue_wait_ms: a burst is let in


def test_a_late_model_is_limited_to_what_it_answers_in_the_wait() -> None:
    limit = _limit_after([0.002] * 20 + [0.08] * 1000)  # ~1,000 answers/s, all late
    allowed = limit.allowed()
    assert 40 <= allowed <= 55  # Little's law: 1,000/s for 50 ms
    limit.busy = int(allowed) - 1
    assert not limit.full()
    limit.busy = int(allowed) + 1
    assert limit.full()


def test_a_limit_never_falls_below_its_floor() -> None:
    limit = _limit_after([0.002] + [0.2] * 10)
    assert limit.allowed() == FLOOR
    limit.busy = FLOOR - 1
    assert not limit.full()


def test_a_slow_model_is_left_to_the_controller() -> None:
    limit = _limit_after([0.4] * 100)  # its quickest answer is far past half the wait
    limit.busy = 1000
    assert limit.allowed() == float("inf") and not limit.full()


def test_a_model_s_quickest_answer_is_forgotten_slowly() -> None:
    limit = _limit_after([0.002] + [0.08] * 100)
    assert limit.quickest == pytest.approx(0.002, rel=0.05)  # load does not lift it
    for _ in range(200 * 60):  # a minute of ticks
        limit.tick(0.005)
    assert 0.0035 < limit.quickest < 0.004  # about 1 % a second
