"""The bytes of request bodies one HTTP frontend holds at once (frontends/http/bodies.py), as
``HttpRequest.body`` counts them: a Content-Length before the first byte, a chunked body as
its chunks arrive, and nothing counted for a request refused."""

from __future__ import annotations

import asyncio

import pytest

from mservd.frontends.http.bodies import BodiesFull, BodyBudget
from mservd.frontends.http.request import HttpRequest


def request(budget: BodyBudget, chunks: list[bytes], headers: dict[str, str]) -> HttpRequest:
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]
    served = []

    async def receive() -> dict:
        served.append(1)
        return messages[len(served) - 1]

    scope = {"method": "POST", "path": "/predictions/m", "query_string": b"",
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    return HttpRequest(scope, receive, budget)


def test_a_lone_body_is_taken_whatever_its_size_and_the_next_past_the_limit_is_refused() -> None:
    budget = BodyBudget(100)
    budget.take(150)  # nothing else held: max_request_size alone bounds it
    with pytest.raises(BodiesFull) as refused:
        budget.take(1)
    assert refused.value.http_status == 503 and refused.value.headers == {"Retry-After": "1"}
    assert "frontend_body_bytes (100)" in refused.value.message
    assert budget.held == 150  # a refusal counts nothing
    budget.give_back(150)
    budget.take(60)
    budget.take(40)  # up to the limit exactly
    assert budget.held == 100


def test_a_content_length_is_counted_before_the_body_is_read() -> None:
    budget = BodyBudget(1000)
    budget.take(900)  # another request's
    late = request(budget, [b"x" * 200], {"content-length": "200"})
    with pytest.raises(BodiesFull):
        asyncio.run(late.body(10_000, 5))
    assert late.held == 0 and budget.held == 900
    budget.give_back(900)
    taken = request(budget, [b"x" * 120, b"y" * 80], {"content-length": "200"})
    assert asyncio.run(taken.body(10_000, 5)) == b"x" * 120 + b"y" * 80
    assert taken.held == 200 and budget.held == 200  # until the app gives it back


def test_a_chunked_body_is_counted_as_its_chunks_arrive_and_refused_midway() -> None:
    budget = BodyBudget(250)
    chunked = {"transfer-encoding": "chunked"}
    grown = request(budget, [b"a" * 100, b"b" * 100], chunked)
    assert asyncio.run(grown.body(10_000, 5)) == b"a" * 100 + b"b" * 100
    assert grown.held == 200 and budget.held == 200
    budget.give_back(grown.held)
    budget.take(100)  # another request's
    cut = request(budget, [b"a" * 100, b"b" * 100], chunked)
    with pytest.raises(BodiesFull):  # its first chunk reaches 200, its second would pass 250
        asyncio.run(cut.body(10_000, 5))
    assert cut.held == 100 and budget.held == 200  # the chunk read: the app gives it back
