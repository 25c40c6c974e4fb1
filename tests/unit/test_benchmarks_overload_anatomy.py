"""The overload anatomy reads the HTTP frontends' access log as mservd writes it: a refusal
made at a frontend's door names no request id, one the controller made names its request."""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.overload_anatomy import access_lines
from mservd.frontends.http.access_log import AccessLog


def test_access_lines_tell_door_refusals_from_the_controllers(tmp_path: Path) -> None:
    path = tmp_path / "access_log.log"
    log = AccessLog(str(path))
    log.write("127.0.0.1", "POST", "/predictions/old", "1.1", 200, time.perf_counter(), "r0")
    log.flush()
    offset = path.stat().st_size  # what came before the loop measured is skipped
    started = time.perf_counter() - 0.004
    log.write("127.0.0.1", "POST", "/predictions/tiny", "1.1", 200, started, "r1")
    log.write("127.0.0.1", "POST", "/predictions/tiny?x=1", "1.1", 503, started, "r2")
    log.write("127.0.0.1", "POST", "/predictions/tiny", "1.1", 503, time.perf_counter(), "-")
    log.close()
    lines = access_lines(path, offset)
    assert [(status, door) for status, _, door in lines] == [(200, False), (503, False),
                                                             (503, True)]
    assert lines[0][1] >= 4.0  # ms inside the frontend, from the line's microseconds
