"""The inference server refuses new predictions while its event loop runs behind."""

from __future__ import annotations

import asyncio
import time

import pytest

from mservd.frontends.http.shedding import Overloaded, Shedder


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
