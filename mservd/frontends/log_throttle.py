"""A cap on lines a stranger can make us log: at most ``burst`` lines of one message per
``period`` seconds. The frontends log a refused connection, a client too slow, a gRPC call that
is no protobuf, each before any token is checked; unthrottled, a flood of them would bury every
other line of the log (and rotate it away, ``log_rotation.py``).

Messages are told apart by their template (``record.msg``, before its arguments), so the state
is one entry per line of code that logs, however many clients there are. The first line let
through after a window says how many were held back in it.
"""

from __future__ import annotations

import logging
import time


class Throttle(logging.Filter):
    def __init__(self, burst: int = 10, period: float = 10.0) -> None:
        super().__init__()
        self.burst, self.period = burst, period
        self._windows: dict[str, list[float]] = {}  # template -> [start, lines let through, held]

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = str(record.msg)
        window = self._windows.get(key)
        if window is None or now - window[0] >= self.period:
            held = int(window[2]) if window else 0
            self._windows[key] = [now, 1, 0]
            if held:
                record.msg = (f"{record.msg} (and {held} more like this in the "
                              f"{self.period:.0f} s before, not logged)")
            return True
        if window[1] < self.burst:
            window[1] += 1
            return True
        window[2] += 1
        return False


def throttled(name: str) -> logging.Logger:
    """The logger ``name``, with a :class:`Throttle` on it."""
    log = logging.getLogger(name)
    if not any(isinstance(f, Throttle) for f in log.filters):
        log.addFilter(Throttle())
    return log
