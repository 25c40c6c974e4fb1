"""The inference server refuses new predictions while its event loop runs behind."""

from __future__ import annotations

import asyncio
import time

import pytest
from http_spec import http_frontend_spec

from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.http.gateway import Gateway
from mservd.frontends.http.shedding import LIMIT_FLOOR, SHARE, TICK, ModelLimit, Overloaded, Shedder


def run_ticks(loop: asyncio.AbstractEventLoop, ticks: list[float], count: int) -> None:
    """Run ``loop`` idle until the shedder has taken ``count`` more lag samples."""
    target = len(ticks) + count

    async def idle() -> None:
        deadline = loop.time() + 10
        while len(ticks) < target:
            assert loop.time() < deadline, f"the shedder took {len(ticks)} of {target} samples"
            await asyncio.sleep(TICK)

    loop.run_until_complete(idle())


def test_a_loop_running_behind_sheds_and_a_caught_up_one_does_not() -> None:
    loop = asyncio.new_event_loop()
    try:
        ticks: list[float] = []
        shedder = Shedder(20, loop, on_tick=ticks.append)
        shedder.busy = 32  # predictions in flight: the lag is theirs
        run_ticks(loop, ticks, 10)
        shedder.check()  # an idle loop is on time

        async def block() -> None:
            for _ in range(12):
                # CPU-bound work holding the loop, turn after turn: blocking is the point
                time.sleep(0.06)  # noqa: ASYNC251
                await asyncio.sleep(0)

        loop.run_until_complete(block())
        with pytest.raises(Overloaded, match="behind"):
            shedder.check()
        shedder.busy = 2
        shedder.check()  # few in flight: the lag is not theirs to shed
        shedder.busy = 32
        run_ticks(loop, ticks, 60)  # idle turns: the smoothed lag decays
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


def _run(limit: ModelLimit, seconds: float, answers: int = 5, latency: float = 0.01,
         busy: int | None = None, grow: int = 0, refused: int = 0) -> ModelLimit:
    """Tick ``limit`` for ``seconds`` (5 ms ticks): each tick, ``answers`` answered after
    ``latency`` seconds, ``refused`` refused at the door, and what is in flight set to ``busy``
    or grown by ``grow``."""
    for _ in range(round(seconds / TICK)):
        for _ in range(answers):
            limit.answered(latency)
        if busy is not None:
            limit.busy = busy
        limit.busy += grow
        limit.refused = refused
        limit.tick(TICK)
    return limit


def _fast_model(busy: int = 20) -> ModelLimit:
    """A fast model (2 ms at best) answering 1,000 a second, on time, for a second."""
    limit = ModelLimit(0.05)
    limit.answered(0.002)
    return _run(limit, 1.0, answers=5, latency=0.01, busy=busy)


def test_a_model_answering_on_time_is_not_limited() -> None:
    limit = _fast_model(busy=30)
    assert limit.limited == float("inf")
    assert not limit.full()  # 30 in flight, on time: a closed loop is let be


def test_a_slowing_model_never_has_more_in_flight_than_it_answers_in_the_wait() -> None:
    limit = _fast_model()
    _run(limit, 0.1, latency=0.02)  # its answers slow down past a third of the wait
    assert limit.capacity == pytest.approx(1000, rel=0.02)
    # 1,000 a second for 50 ms: a mean wait of the whole max_queue_wait_ms
    assert limit.allowed == pytest.approx(limit.capacity * 0.05)
    limit.busy = 48
    assert not limit.full()
    limit.busy = 52
    assert limit.full()


def test_a_burst_onto_a_quick_model_is_let_in() -> None:
    limit = _fast_model(busy=2)
    _run(limit, 0.2, busy=45, latency=0.02)  # one jump, then steady: a closed loop starting
    assert limit.limited == float("inf") and not limit.full()
    limit = _run(ModelLimit(0.05), 1.0, answers=1, latency=0.002, busy=1)  # 200 a second
    limit.busy = 300  # a burst far past what it was ever asked for: quick answers, let in
    assert not limit.full()


def test_a_model_whose_in_flight_keeps_rising_is_limited_to_its_share() -> None:
    limit = _run(_fast_model(busy=2), 0.1, grow=2)  # a steady excess of arrivals
    assert limit.busy > 25  # past half its ceiling
    assert limit.limited == pytest.approx(1000 * 0.05 / SHARE, rel=0.05)
    assert limit.full()


def test_a_model_whose_answers_come_late_is_limited() -> None:
    limit = _fast_model(busy=30)
    _run(limit, 0.3, latency=0.08, busy=30)  # no rise, but answers later than the wait
    assert limit.limited == pytest.approx(1000 * 0.05 / SHARE, rel=0.05)


def test_a_limit_follows_the_latency_and_is_lifted_when_nothing_is_refused() -> None:
    limit = _run(_fast_model(busy=2), 0.1, grow=2)
    share = limit.limited
    _run(limit, 0.2, latency=0.03, busy=int(share), refused=3)  # late for the share's target
    assert limit.limited <= share
    held = limit.limited
    _run(limit, 0.2, latency=0.005, busy=int(held), refused=3)  # on time: it grows
    assert limit.limited > held * 1.1
    _run(limit, 0.6, latency=0.005, busy=5)  # nothing refused for LIFT: lifted
    assert limit.limited == float("inf")


def test_clients_spinning_on_refusals_lift_the_limit_for_a_while() -> None:
    limit = _run(_fast_model(busy=2), 0.1, grow=2)
    assert limit.limited < float("inf")
    _run(limit, 0.1, busy=40, refused=15)  # 3,000 refused a second: clients resending at once
    assert limit.allowed == float("inf") and not limit.full()
    _run(limit, 1.0, busy=40, latency=0.02)
    assert limit.allowed < float("inf")  # calm is over: a slowing model has its ceiling back


def test_a_limit_never_falls_below_its_floor() -> None:
    limit = _run(_fast_model(busy=2), 0.1, grow=2)
    _run(limit, 1.0, answers=1, latency=0.2, busy=40, refused=1)  # 200 a second, all late
    assert limit.limited == LIMIT_FLOOR


def test_a_slow_model_is_left_to_the_controller() -> None:
    limit = ModelLimit(0.05)
    _run(limit, 1.0, answers=1, latency=0.4, busy=1000)  # its quickest answer: far past the wait
    assert limit.allowed == float("inf") and not limit.full()


def test_an_idle_model_s_lateness_fades() -> None:
    limit = _fast_model()
    _run(limit, 0.1, latency=0.2)
    assert limit.latency > 0.05
    _run(limit, 0.2, answers=0, busy=0)
    assert limit.latency < 0.01  # the next burst is not judged by the last one's lateness


def test_a_model_s_quickest_answer_is_forgotten_slowly() -> None:
    limit = _fast_model()
    _run(limit, 0.1, latency=0.08)
    assert limit.quickest == pytest.approx(0.002, rel=0.05)  # load does not lift it
    _run(limit, 60.0, answers=0, busy=0)  # a minute idle
    assert 0.0035 < limit.quickest < 0.004  # about 1 % a second


@pytest.mark.parametrize("settings, ticking", [
    ({}, False),  # the defaults: nothing to sample, no timer waking the process
    ({"shed_delay_ms": 20}, True),
    ({"max_queue_wait_ms": 50}, True),
])
def test_a_frontend_samples_its_loop_only_when_a_shedding_rule_is_on(settings, ticking) -> None:
    loop = asyncio.new_event_loop()
    try:
        Gateway(http_frontend_spec(**settings), AsyncBridge("ipc:///nowhere"), loop)
        assert bool(loop._scheduled) is ticking  # the sampler's timer, armed or not
    finally:
        loop.close()
