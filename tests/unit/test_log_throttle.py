"""The throttle on lines a stranger can make the frontends log."""

from __future__ import annotations

import logging

from mservd.frontends.log_throttle import Throttle


def _record(template: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("t", logging.WARNING, __file__, 1, template, args, None)


def test_each_message_gets_its_own_burst_per_period_and_the_next_says_what_was_held(
        monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("mservd.frontends.log_throttle.time.monotonic", lambda: clock[0])
    throttle = Throttle(burst=3, period=10.0)
    passed = [throttle.filter(_record("refused %s", n)) for n in range(8)]
    assert passed == [True] * 3 + [False] * 5
    assert throttle.filter(_record("too slow %s", 1))  # another message: its own window
    clock[0] += 10.0
    later = _record("refused %s", 9)
    assert throttle.filter(later)
    assert later.getMessage() == "refused 9 (and 5 more like this in the 10 s before, not logged)"
    quiet = _record("refused %s", 10)
    assert throttle.filter(quiet) and quiet.getMessage() == "refused 10"
