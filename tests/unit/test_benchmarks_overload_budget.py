"""The overload budget shuts every frontend's door through a ``sitecustomize`` on the daemon's
``PYTHONPATH``: each of its processes must load it, and only while the tool asks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.overload_budget import DOOR_SHUT

ASK_THE_DOOR = (
    "import json; from mservd.frontends.http.shedding import Door; "
    "body = Door(0.1).refusal('/predictions/tiny'); "
    "print(json.dumps(None if body is None else json.loads(body)))")


def door_answer(shut: bool) -> object:
    env = {**os.environ, "PYTHONPATH": str(DOOR_SHUT)}
    env.pop("MSERVD_BENCH_DOOR_SHUT", None)
    if shut:
        env["MSERVD_BENCH_DOOR_SHUT"] = "1"
    out = subprocess.run([sys.executable, "-c", ASK_THE_DOOR], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_the_shut_door_refuses_every_prediction_as_overloaded() -> None:
    body = door_answer(shut=True)
    assert body["code"] == 503
    assert body["type"] == "ServiceUnavailableException"


def test_without_the_tools_switch_the_door_lets_an_idle_models_prediction_in() -> None:
    assert door_answer(shut=False) is None
