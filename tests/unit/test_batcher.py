"""The batching policy, with a fake clock: nothing here sleeps."""

from __future__ import annotations

from dataclasses import dataclass

from mservd.core.batcher import Batcher
from mservd.protocol import DESCRIPTION, EXPLANATION, PREDICTION


@dataclass
class Item:
    name: str
    arrived: float
    deadline: float = 100.0
    kind: int = PREDICTION


def test_batcher_sends_a_lone_request_at_once_when_no_worker_is_busy() -> None:
    b = Batcher(batch_size=8, max_batch_delay=1.0, capacity=10)
    b.add(Item("a", 0.0))
    assert [i.name for i in b.take(now=0.0, any_busy=False)] == ["a"]


def test_batcher_waits_for_batch_mates_while_a_worker_is_busy() -> None:
    b = Batcher(batch_size=4, max_batch_delay=0.5, capacity=10)
    b.add(Item("a", 0.0))
    b.add(Item("b", 0.1))
    assert b.take(now=0.2, any_busy=True) == []
    assert b.next_wakeup(any_busy=True) == 0.5
    assert b.next_wakeup(any_busy=True, any_idle=False) == 100.0  # none free: a deadline only


def test_batcher_flushes_when_delay_expires() -> None:
    b = Batcher(batch_size=4, max_batch_delay=0.5, capacity=10)
    b.add(Item("a", 0.0))
    b.add(Item("b", 0.1))
    assert [i.name for i in b.take(now=0.5, any_busy=True)] == ["a", "b"]


def test_batcher_flushes_a_full_batch_at_once_oldest_first() -> None:
    b = Batcher(batch_size=2, max_batch_delay=10.0, capacity=10)
    for n, name in enumerate("abc"):
        b.add(Item(name, float(n)))
    assert [i.name for i in b.take(now=2.0, any_busy=True)] == ["a", "b"]
    assert len(b) == 1


def test_batcher_refuses_past_its_capacity() -> None:
    b = Batcher(batch_size=1, max_batch_delay=0.0, capacity=2)
    assert b.add(Item("a", 0.0)) and b.add(Item("b", 0.0))
    assert not b.add(Item("c", 0.0))
    assert b.remaining_capacity == 0


def test_batcher_expires_requests_past_their_own_deadline_in_any_order() -> None:
    b = Batcher(batch_size=8, max_batch_delay=0.0, capacity=10)
    b.add(Item("late", 0.0, deadline=5.0))
    b.add(Item("soon", 0.1, deadline=1.0))
    assert b.next_wakeup(any_busy=False) == 1.0
    assert [i.name for i in b.expire(now=1.0)] == ["soon"]
    assert [i.name for i in b.expire(now=4.0)] == []
    assert [i.name for i in b.expire(now=5.0)] == ["late"]
    assert b.next_wakeup(any_busy=False) is None


def test_batcher_puts_a_retried_request_first_even_when_full() -> None:
    b = Batcher(batch_size=8, max_batch_delay=0.0, capacity=1)
    b.add(Item("queued", 1.0))
    b.push_front(Item("retried", 0.0))
    assert [i.name for i in b.take(now=1.0, any_busy=False)] == ["retried", "queued"]


def test_batcher_removes_what_the_predicate_selects() -> None:
    b = Batcher(batch_size=8, max_batch_delay=0.0, capacity=10)
    for name in "abc":
        b.add(Item(name, 0.0))
    assert [i.name for i in b.remove(lambda i: i.name == "b")] == ["b"]
    assert [i.name for i in b.drain()] == ["a", "c"]


def test_batcher_never_mixes_explanations_with_predictions() -> None:
    b = Batcher(batch_size=8, max_batch_delay=0.0, capacity=10)
    for name, kind in (("p1", PREDICTION), ("p2", PREDICTION), ("e1", EXPLANATION),
                       ("p3", PREDICTION)):
        b.add(Item(name, 0.0, kind=kind))
    assert [i.name for i in b.take(now=0.0, any_busy=False)] == ["p1", "p2", "p3"]
    assert [i.name for i in b.take(now=0.0, any_busy=False)] == ["e1"]
    assert len(b) == 0


def test_batcher_runs_each_describe_question_alone_in_its_turn() -> None:
    b = Batcher(batch_size=8, max_batch_delay=0.0, capacity=10)
    for name, kind in (("d1", DESCRIPTION), ("d2", DESCRIPTION), ("p1", PREDICTION),
                       ("p2", PREDICTION)):
        b.add(Item(name, 0.0, kind=kind))
    assert [i.name for i in b.take(now=0.0, any_busy=False)] == ["d1"]
    assert [i.name for i in b.take(now=0.0, any_busy=False)] == ["d2"]
    assert [i.name for i in b.take(now=0.0, any_busy=False)] == ["p1", "p2"]
