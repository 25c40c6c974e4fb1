"""Put on ``PYTHONPATH`` by ``benchmarks.overload_budget`` for the daemon it starts: every
prediction is refused at its HTTP frontend's door, so that the CPU of a door refusal can be
measured alone. Python imports this module at start-up in each of mservd's processes; only the
frontends ever ask the door."""

import os

if os.environ.get("MSERVD_BENCH_DOOR_SHUT"):
    from mservd.frontends.http import shedding

    _BODY = shedding.Overloaded("Refused at the door: benchmarks.overload_budget.").to_body()
    shedding.Door.refusal = lambda self, path: _BODY  # type: ignore[method-assign]
