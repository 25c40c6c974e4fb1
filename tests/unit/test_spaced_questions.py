"""Questions anyone may make the controller answer (health, metrics, a stranger's token) are
asked one at a time, spaced, and no answer is older than its question."""

from __future__ import annotations

import asyncio

import pytest

from mservd.frontends import spaced
from mservd.frontends.spaced import SpacedQuestions, TooManyQuestions


class Controller:
    """Stands in for the controller: each answer takes ``seconds`` and says which it was."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.answers: list[tuple[float, float, object]] = []  # started, ended, key

    async def ask(self, key) -> str:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.sleep(self.seconds)
        self.answers.append((started, loop.time(), key))
        return f"answer {len(self.answers)}"


def test_a_flood_of_questions_holds_the_controller_at_most_a_tenth_of_the_time() -> None:
    async def flood() -> tuple[Controller, list[str], float]:
        controller = Controller(0.002)
        questions = SpacedQuestions(controller.ask, "questions")
        loop = asyncio.get_running_loop()
        started = loop.time()
        asked = []
        while loop.time() - started < 0.5:  # a question every millisecond
            asked.append(loop.create_task(questions.answer(())))
            await asyncio.sleep(0.001)
        return controller, await asyncio.gather(*asked), loop.time() - started

    controller, answers, seconds = asyncio.run(flood())
    assert all(answer.startswith("answer ") for answer in answers)
    busy = sum(ended - started for started, ended, _ in controller.answers)
    assert busy <= seconds / (1 + spaced.SPACING) + 0.003
    assert len(controller.answers) < len(answers) / 5
    for (_, ended, _), (started, _, _) in zip(controller.answers, controller.answers[1:]):
        assert started - ended >= spaced.SPACING * 0.002 * 0.9


def test_a_question_is_never_answered_with_an_answer_begun_before_it_arrived() -> None:
    async def overlap() -> tuple[Controller, str, str]:
        controller = Controller(0.02)
        questions = SpacedQuestions(controller.ask, "questions")
        first = asyncio.get_running_loop().create_task(questions.answer(()))
        await asyncio.sleep(0.01)  # the first question is under way
        second = await questions.answer(())
        return controller, await first, second

    _controller, first, second = asyncio.run(overlap())
    assert (first, second) == ("answer 1", "answer 2")


def test_a_lone_question_waits_for_nothing_and_different_ones_are_asked_apart() -> None:
    async def lone() -> tuple[Controller, float, list[str]]:
        controller = Controller(0.0)
        questions = SpacedQuestions(controller.ask, "questions")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await questions.answer(())
        took = loop.time() - started
        both = await asyncio.gather(questions.answer(("a",)), questions.answer(("b",)))
        return controller, took, both

    controller, took, both = asyncio.run(lone())
    assert took < 0.5  # no spacing wait (which would be seconds), on a slow minute too
    assert [names for _, _, names in controller.answers] == [(), ("a",), ("b",)]
    assert both == ["answer 2", "answer 3"]


def test_too_many_different_questions_waiting_at_once_are_refused() -> None:
    async def many() -> None:
        questions = SpacedQuestions(Controller(0.01).ask, "questions")
        waiting = [asyncio.get_running_loop().create_task(questions.answer((str(n),)))
                   for n in range(spaced.MAX_WAITING)]
        await asyncio.sleep(0)
        with pytest.raises(TooManyQuestions):
            await questions.answer(("one more",))
        for task in waiting:
            task.cancel()

    asyncio.run(many())
