"""The metrics route asks the controller for one rendering at a time, spaced, and never
answers a scrape with a rendering older than it."""

from __future__ import annotations

import asyncio

import pytest

from mservd.frontends.http import metrics
from mservd.frontends.http.shedding import Overloaded
from mservd.protocol import Reply


class Controller:
    """Stands in for the controller's end of the bridge: each rendering takes ``seconds`` and
    says which it was."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.renderings: list[tuple[float, float, list[str]]] = []  # started, ended, names

    async def manage(self, op, args, token, timeout, **kwargs) -> Reply:
        assert op == "metrics"
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.sleep(self.seconds)
        self.renderings.append((started, loop.time(), args["names"]))
        return Reply(200, f"rendering {len(self.renderings)}".encode(), content_type="text/plain")


def test_a_flood_of_scrapes_is_rendered_at_most_a_tenth_of_the_time() -> None:
    async def flood() -> tuple[Controller, list[float], float]:
        controller = Controller(0.002)
        routes = metrics.MetricsRoutes(controller)
        loop = asyncio.get_running_loop()
        started = loop.time()
        scrapes = []
        while loop.time() - started < 0.5:  # a scrape every millisecond
            scrapes.append(loop.create_task(routes.rendering(())))
            await asyncio.sleep(0.001)
        await asyncio.gather(*scrapes)
        return controller, [s.result().status for s in scrapes], loop.time() - started

    controller, statuses, seconds = asyncio.run(flood())
    assert statuses == [200] * len(statuses)
    busy = sum(ended - started for started, ended, _ in controller.renderings)
    assert busy <= seconds / (1 + metrics.SPACING) + 0.003
    assert len(controller.renderings) < len(statuses) / 5
    for (_, ended, _), (started, _, _) in zip(controller.renderings, controller.renderings[1:]):
        assert started - ended >= metrics.SPACING * 0.002 * 0.9


def test_a_scrape_is_never_answered_with_a_rendering_begun_before_it_arrived() -> None:
    async def overlap() -> tuple[Controller, bytes, bytes]:
        controller = Controller(0.02)
        routes = metrics.MetricsRoutes(controller)
        first = asyncio.get_running_loop().create_task(routes.rendering(()))
        await asyncio.sleep(0.01)  # the first rendering is under way
        second = await routes.rendering(())
        return controller, (await first).body, second.body

    controller, first, second = asyncio.run(overlap())
    assert (first, second) == (b"rendering 1", b"rendering 2")


def test_a_lone_scrape_waits_for_nothing_and_selections_are_rendered_apart() -> None:
    async def lone() -> tuple[Controller, float, list[Reply]]:
        controller = Controller(0.0)
        routes = metrics.MetricsRoutes(controller)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await routes.rendering(())
        took = loop.time() - started
        both = await asyncio.gather(routes.rendering(("a",)), routes.rendering(("b",)))
        return controller, took, both

    controller, took, both = asyncio.run(lone())
    assert took < 0.05
    assert [names for _, _, names in controller.renderings] == [[], ["a"], ["b"]]
    assert [reply.body for reply in both] == [b"rendering 2", b"rendering 3"]


def test_too_many_different_selections_waiting_at_once_are_refused() -> None:
    async def many() -> None:
        routes = metrics.MetricsRoutes(Controller(0.01))
        waiting = [asyncio.get_running_loop().create_task(routes.rendering((str(n),)))
                   for n in range(metrics.MAX_WAITING)]
        await asyncio.sleep(0)
        with pytest.raises(Overloaded):
            await routes.rendering(("one more",))
        for task in waiting:
            task.cancel()

    asyncio.run(many())
