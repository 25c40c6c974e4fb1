"""The scheduler's policy with a fake clock and worker handles without processes: admission,
deadlines, batches, retries and answers, as the actions it asks the controller to perform."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mservd import protocol
from mservd.config import Settings, resolve_model_settings
from mservd.core.metrics import Metrics
from mservd.core.registry import ModelVersion, Registry
from mservd.core.scheduler import Forward, KillWorker, Refuse, Scheduler, SendBatch
from mservd.core.worker_handle import WorkerHandle, WorkerState
from mservd.errors import MservdError

FRONTEND = b"frontend-1"


def setup(workers: int = 1, settings: Settings | None = None, model_yaml: dict | None = None,
          **api) -> tuple[Scheduler, ModelVersion]:
    settings = settings or Settings()
    registry = Registry()
    model = resolve_model_settings(settings, "m", "1.0", model_yaml=model_yaml, api=api or None)
    mv = ModelVersion(name="m", version="1.0", url="m.mar", model_dir=Path("/nowhere"),
                      manifest={}, settings=model, model_yaml=model_yaml or {})
    registry.add(mv)
    for i in range(workers):
        worker = WorkerHandle(str(9000 + i), "m", "1.0", proc=None, gpu_id=None, mv=mv)
        worker.state = WorkerState.SERVING
        mv.workers[worker.id] = worker
    return Scheduler(settings, registry, Metrics()), mv


def route(rid: bytes, sent: float, **kwargs) -> protocol.Route:
    return protocol.Route(rid, "m", None, None, sent=sent, **kwargs)


def ok(rid: bytes) -> protocol.Result:
    return protocol.Result(rid, protocol.head(200), b"{}")


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_scheduler_sends_a_lone_request_to_an_idle_worker_at_once() -> None:
    s, _mv = setup(batch_size=4, max_batch_delay=100)
    [send] = s.submit(FRONTEND, route(b"a", 10.0), [b"meta", b"x"], now=10.0)
    assert isinstance(send, SendBatch) and [p.rid for p in send.requests] == [b"a"]
    assert s.is_busy(send.worker)


def test_scheduler_requests_that_arrive_in_one_message_share_a_batch() -> None:
    s, mv = setup(batch_size=4, max_batch_delay=100)
    for rid in (b"a", b"b", b"c"):  # one PREDICT message: each enqueued, then one dispatch
        queued, refused = s.enqueue(FRONTEND, route(rid, 1.0), [], now=1.0)
        assert queued is mv and refused == []
    [send] = s.dispatch(mv, now=1.0)
    assert isinstance(send, SendBatch) and [p.rid for p in send.requests] == [b"a", b"b", b"c"]


def test_scheduler_batches_requests_that_queue_while_the_worker_is_busy() -> None:
    s, _mv = setup(batch_size=4, max_batch_delay=100)
    [first] = s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    for rid in (b"b", b"c"):
        assert s.submit(FRONTEND, route(rid, 0.01), [], now=0.01) == []
    actions = s.finished(first.worker, [ok(b"a")], now=0.05)
    assert kinds(actions) == ["Forward", "SendBatch"]
    assert [p.rid for p in actions[1].requests] == [b"b", b"c"]


def test_scheduler_refuses_with_503_when_the_queue_is_full() -> None:
    s, _mv = setup(settings=Settings(job_queue_size=1), batch_size=1)
    s.submit(FRONTEND, route(b"running", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"queued", 0.0), [], now=0.0)
    [refused] = s.submit(FRONTEND, route(b"over", 0.0), [], now=0.0)
    assert isinstance(refused, Refuse) and refused.error.http_status == 503
    assert refused.error.headers == {"Retry-After": "1"}


def test_scheduler_refuses_a_standing_queue_at_once() -> None:
    s, _mv = setup(settings=Settings(max_queue_wait_ms=100), batch_size=1, max_batch_delay=0)
    s.submit(FRONTEND, route(b"running", 0.0), [], now=0.0)
    assert s.submit(FRONTEND, route(b"head", 0.0), [], now=0.0) == []
    [refused] = s.submit(FRONTEND, route(b"late", 0.5), [], now=0.5)
    assert refused.error.http_status == 503 and "overloaded" in refused.error.message


def test_by_default_a_standing_queue_is_served_not_refused() -> None:
    s, _mv = setup(batch_size=1, max_batch_delay=0)  # a closed loop's queue is not overload
    s.submit(FRONTEND, route(b"running", 0.0), [], now=0.0)
    assert s.submit(FRONTEND, route(b"head", 0.0), [], now=0.0) == []
    assert s.submit(FRONTEND, route(b"late", 0.5), [], now=0.5) == []


def test_a_request_that_would_pass_its_deadline_behind_the_queue_is_refused_at_once() -> None:
    s, mv = setup(batch_size=2, max_batch_delay=0)
    mv.batch_seconds = 0.1  # its recent batch time
    s.submit(FRONTEND, route(b"running", 0.0), [], now=0.0)
    for n in range(6):  # three batches queued: about 0.3 s before a new one is taken
        assert s.submit(FRONTEND, route(b"q%d" % n, 0.0), [], now=0.0) == []
    assert s.submit(FRONTEND, route(b"patient", 0.0, timeout_ms=1000), [], now=0.0) == []
    [refused] = s.submit(FRONTEND, route(b"hurried", 0.0, timeout_ms=200), [], now=0.0)
    assert refused.error.http_status == 503 and "deadline" in refused.error.message
    assert refused.error.headers == {"Retry-After": "1"}


def test_a_latency_target_sheds_once_the_queue_head_cannot_meet_it() -> None:
    settings = Settings(models={"m": {"1.0": {"maxLatencyMs": 100}}})
    s, mv = setup(settings=settings, batch_size=1, max_batch_delay=0)
    mv.batch_seconds = 0.04
    s.submit(FRONTEND, route(b"running", 0.0), [], now=0.0)
    assert s.submit(FRONTEND, route(b"head", 0.0), [], now=0.0) == []
    assert s.submit(FRONTEND, route(b"soon", 0.05), [], now=0.05) == []  # 50 + 40 <= 100 ms
    [refused] = s.submit(FRONTEND, route(b"late", 0.07), [], now=0.07)  # 70 + 40 > 100 ms
    assert refused.error.http_status == 503 and "latency target" in refused.error.message


def test_a_latency_target_stops_shedding_clients_that_resend_at_once() -> None:
    from mservd.core.spinning import SPIN_FLOOR, WINDOW

    settings = Settings(models={"m": {"1.0": {"maxLatencyMs": 100}}})
    s, mv = setup(settings=settings, batch_size=1, max_batch_delay=0)
    mv.batch_seconds = 0.04
    s.submit(FRONTEND, route(b"running", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"head", 0.0), [], now=0.0)
    for n in range(SPIN_FLOOR):  # a closed loop: each refusal comes straight back
        [refused] = s.submit(FRONTEND, route(b"spin%d" % n, 0.07), [], now=0.07)
        assert "latency target" in refused.error.message
    # refused 32 times in a window that answered nothing: refusing only makes them spin
    assert s.submit(FRONTEND, route(b"let-in", 0.07 + WINDOW), [], now=0.07 + WINDOW) == []
    assert len(mv.batcher) == 2


def test_auto_batching_tries_a_larger_size_and_sizes_at_most_every_tenth_of_a_second() -> None:
    settings = Settings(models={"m": {"1.0": {"batchSize": "auto"}}})
    s, mv = setup(settings=settings, max_batch_delay=0)
    assert mv.batcher.batch_size == 8

    sent: list[SendBatch] = []  # the next batch, sent as the last one finished

    def full_batches(count: int, now: float, took: float) -> float:
        for n in range(count):
            for i in range(8):
                s.enqueue(FRONTEND, route(b"%f.%d.%d" % (now, n, i), now), [], now=now)
            send = sent.pop() if sent else s.dispatch(mv, now)[0]
            now += took
            sent.extend(a for a in s.finished(send.worker, [ok(p.rid) for p in send.requests],
                                              now) if isinstance(a, SendBatch))
        return now

    for i in range(8):  # a batch's worth more than it runs waits: demand for a batch of 16
        s.enqueue(FRONTEND, route(b"ahead.%d" % i, 10.0), [], now=10.0)
    now = full_batches(8, 10.0, 0.001)  # 8 full batches of 8 measured: try 16 next
    assert mv.batcher.batch_size == 16 and mv.sized_at == now
    sized = mv.sized_at
    now = full_batches(8, now, 0.001)  # 8 more within 0.1 s: not sized again
    assert mv.sized_at == sized
    now = full_batches(8, now, 0.02)  # sized again once 0.1 s has passed
    assert sized + 0.1 <= mv.sized_at <= now


def test_auto_batching_batches_no_more_than_the_workers_share_of_what_it_holds() -> None:
    settings = Settings(models={"m": {"1.0": {"batchSize": "auto"}}})
    s, mv = setup(workers=2, settings=settings, max_batch_delay=0)
    now = 10.0
    for n in range(32):  # 8 clients resending at once: 8 held, one worker takes them all
        for i in range(8):
            s.enqueue(FRONTEND, route(b"%d.%d" % (n, i), now), [], now=now)
        sends = s.dispatch(mv, now)
        now += 0.02
        for send in sends:
            s.finished(send.worker, [ok(p.rid) for p in send.requests], now)
        sizes = [len(send.requests) for send in sends]
    # a batch of 8 leaves the other worker idle however well it measures per worker
    assert max(sizes) <= 4


def test_an_idle_worker_takes_no_more_than_its_share_of_what_the_version_holds() -> None:
    """A lone request went at once to one worker; its seven batch-mates, arriving next, are
    split with it (4 and 4 by turns), not all taken by the other worker (1 and 7)."""
    s, _mv = setup(workers=2, batch_size=8, max_batch_delay=5)
    [lone] = s.submit(FRONTEND, route(b"lone", 0.0), [], now=0.0)
    for i in range(7):
        assert s.submit(FRONTEND, route(b"%d" % i, 0.001), [], now=0.001) == []
    [second] = s.tick(now=0.006)  # the batch delay is over: the idle worker takes its share
    assert len(second.requests) == 4  # (7 queued + 1 running) / 2 workers
    [third] = [a for a in s.finished(lone.worker, [ok(b"lone")], now=0.05)
               if kinds([a]) == ["SendBatch"]]
    assert [p.rid for p in third.requests] == [b"4", b"5", b"6"]


def test_scheduler_answers_504_for_a_request_past_its_deadline_in_the_queue() -> None:
    s, _mv = setup(batch_size=1)
    s.submit(FRONTEND, route(b"running", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"hurried", 0.0, timeout_ms=200.0), [], now=0.0)
    assert s.tick(now=0.1) == []
    assert s.next_wakeup(soonest=100.0) == 0.2
    [expired] = s.tick(now=0.25)
    assert expired.rid == b"hurried" and expired.error.http_status == 504


def test_scheduler_does_not_wake_for_a_partial_batch_while_every_worker_is_busy() -> None:
    s, _mv = setup(workers=2, batch_size=4, max_batch_delay=5)
    [first] = s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    assert s.submit(FRONTEND, route(b"b", 0.001), [], now=0.001) == []  # waits for mates
    assert s.next_wakeup(soonest=100.0) == 0.006  # a worker is free: its batch delay counts
    [second] = s.tick(now=0.006)
    assert [p.rid for p in second.requests] == [b"b"]
    assert s.submit(FRONTEND, route(b"c", 0.007), [], now=0.007) == []
    # its batch delay passes at 0.012, but no worker is free to take it: only a worker's
    # answer can start it, and that wakes the loop itself (it used to spin until then)
    assert s.next_wakeup(soonest=100.0) == 100.0
    actions = s.finished(first.worker, [ok(b"a")], now=0.2)
    assert kinds(actions) == ["Forward", "SendBatch"]
    assert [p.rid for p in actions[1].requests] == [b"c"]


def test_scheduler_kills_a_worker_whose_batch_hangs_and_does_not_retry_it() -> None:
    s, _mv = setup(workers=2, batch_size=1, response_timeout=5)
    [send] = s.submit(FRONTEND, route(b"hang", 0.0), [], now=0.0)
    [kill] = s.tick(now=6.0)
    assert isinstance(kill, KillWorker) and kill.worker is send.worker
    assert s.tick(now=7.0) == []  # killed once
    [failed] = s.worker_lost(send.worker, now=7.0)
    assert isinstance(failed, Refuse) and failed.error.http_status == 500


def test_scheduler_retries_a_dead_workers_request_once_on_another_worker() -> None:
    s, mv = setup(workers=2, batch_size=1)
    [send] = s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    dead = send.worker
    del mv.workers[dead.id]
    [again] = s.worker_lost(dead, now=1.0)
    assert isinstance(again, SendBatch) and again.worker is not dead
    del mv.workers[again.worker.id]
    [failed] = s.worker_lost(again.worker, now=2.0)
    assert isinstance(failed, Refuse) and failed.error.message == "Worker died."


def test_scheduler_answers_a_request_the_worker_left_out_with_an_error() -> None:
    s, _mv = setup(batch_size=2, max_batch_delay=0)
    [first] = s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"b", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"c", 0.0), [], now=0.0)
    [second] = s.finished(first.worker, [ok(b"a")], now=0.1)[1:]
    actions = s.finished(second.worker, [ok(b"b")], now=0.2)
    assert kinds(actions) == ["Forward", "Refuse"]
    assert actions[1].rid == b"c" and "no answer" in actions[1].error.message


def test_scheduler_forwards_answers_to_the_frontend_that_asked() -> None:
    s, _mv = setup()
    [send] = s.submit(b"frontend-2", route(b"a", 0.0), [], now=0.0)
    [forward] = s.finished(send.worker, [ok(b"a")], now=0.1)
    assert forward == Forward(b"frontend-2", ok(b"a"))


def test_scheduler_counts_answers_a_worker_sent_itself_and_forwards_none() -> None:
    s, mv = setup(batch_size=2)
    s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"b", 0.0), [], now=0.0)  # queued behind a's batch
    [worker] = mv.workers.values()
    sent = [protocol.Result(b"a", protocol.head(200), b"")]  # ANSWERED: heads, no bodies
    [next_batch] = s.finished(worker, sent, now=0.1, answered=True)
    assert isinstance(next_batch, SendBatch) and [p.rid for p in next_batch.requests] == [b"b"]
    assert s.metrics.version(mv.key).answers == {200: 1} and s.metrics.classes["2XX"] == 1


def test_a_describe_question_runs_alone_after_the_queue_and_is_not_counted_as_traffic() -> None:
    s, mv = setup(batch_size=4, max_batch_delay=100)
    [first] = s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    assert s.ask(mv, b"controller", b"ask-1", [b"meta"], now=0.01) == []  # the worker is busy
    s.submit(FRONTEND, route(b"b", 0.02), [], now=0.02)
    [_forward, question] = s.finished(first.worker, [ok(b"a")], now=0.05)
    assert [p.rid for p in question.requests] == [b"ask-1"]  # alone, ahead of b
    [answer, batch] = s.finished(first.worker, [ok(b"ask-1")], now=0.06)
    assert answer == Forward(b"controller", ok(b"ask-1"))
    assert [p.rid for p in batch.requests] == [b"b"]
    vm = s.metrics.version(mv.key)
    assert vm.answers == {200: 1} and list(mv.batch_costs.samples) == [(1, 0.05)]


def test_a_describe_question_is_refused_as_a_request_would_be_without_a_worker() -> None:
    s, mv = setup(workers=0)
    with pytest.raises(MservdError, match="scale workers") as refused:
        s.ask(mv, b"controller", b"ask-1", [b"meta"], now=0.0)
    assert refused.value.http_status == 503 and len(mv.batcher) == 0


def test_scheduler_drops_a_queued_request_whose_client_went_away() -> None:
    s, mv = setup(batch_size=1)
    s.submit(FRONTEND, route(b"running", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"gone", 0.0), [], now=0.0)
    assert s.cancel(FRONTEND, b"gone", now=0.1) == (mv, [])
    assert len(mv.batcher) == 0 and s.cancel(FRONTEND, b"gone", now=0.1) == (None, [])


def test_scheduler_refuses_a_model_without_a_serving_worker() -> None:
    s, _mv = setup(workers=0)
    [refused] = s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    assert refused.error.http_status == 503 and "No worker" in refused.error.message


def test_scheduler_answers_everything_when_the_server_stops() -> None:
    s, _mv = setup(batch_size=1)
    s.submit(FRONTEND, route(b"running", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"queued", 0.0), [], now=0.0)
    assert not s.idle()
    closed = s.close("The server stopped.")
    assert sorted(a.rid for a in closed) == [b"queued", b"running"]
    assert s.idle()


def test_continuous_batching_fills_free_slots_at_once_and_answers_each_request_alone() -> None:
    s, mv = setup(settings=Settings(), batch_size=2, max_batch_delay=100)
    mv.settings = dataclasses.replace(mv.settings, continuous_batching=True)
    [first] = s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    [second] = s.submit(FRONTEND, route(b"b", 0.01), [], now=0.01)  # joins, no batch delay
    assert first.worker is second.worker and [p.rid for p in second.requests] == [b"b"]
    assert s.submit(FRONTEND, route(b"c", 0.02), [], now=0.02) == []  # both slots taken
    assert s.progress(first.worker, b"a", now=0.5) == FRONTEND  # a streamed part of "a"
    actions = s.finished(first.worker, [ok(b"b")], now=1.0)  # "b" finished, "a" runs on
    assert kinds(actions) == ["Forward", "SendBatch"]
    assert [p.rid for p in actions[1].requests] == [b"c"]
    assert s.is_busy(first.worker)


def test_continuous_batching_with_every_slot_taken_wakes_only_for_a_queued_deadline() -> None:
    s, mv = setup(settings=Settings(), batch_size=2, max_batch_delay=5)
    mv.settings = dataclasses.replace(mv.settings, continuous_batching=True)
    [first] = s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"b", 0.0), [], now=0.0)
    assert s.submit(FRONTEND, route(b"c", 0.001, timeout_ms=30_000.0), [], now=0.001) == []
    # its batch delay passed at 0.006, but no slot is free: only an answer can start it, and
    # that wakes the loop itself (the loop spun at 0.6 of a core till then: 20 streams on 16
    # slots made 20 tokens/s where 16 streams made 88)
    assert s.next_wakeup(soonest=100.0, now=0.5) == pytest.approx(30.001)
    assert s.tick(now=0.5) == []
    actions = s.finished(first.worker, [ok(b"a")], now=1.0)
    assert kinds(actions) == ["Forward", "SendBatch"]
    assert [p.rid for p in actions[1].requests] == [b"c"]


def test_continuous_batching_spreads_new_sequences_over_the_workers_running_fewest() -> None:
    s, mv = setup(workers=2, settings=Settings(), batch_size=4)
    mv.settings = dataclasses.replace(mv.settings, continuous_batching=True)
    for rid in (b"a", b"b", b"c"):
        s.enqueue(FRONTEND, route(rid, 0.0), [], now=0.0)
    sends = s.dispatch(mv, now=0.0)
    assert sorted(len(send.requests) for send in sends) == [1, 2]
    assert len({send.worker.id for send in sends}) == 2
    s.enqueue(FRONTEND, route(b"d", 0.1), [], now=0.1)
    [send] = s.dispatch(mv, now=0.1)  # to the worker that runs one, not the one that runs two
    fewer = next(sent.worker for sent in sends if len(sent.requests) == 1)
    assert send.worker is fewer and [p.rid for p in send.requests] == [b"d"]


def test_continuous_batching_sends_a_new_sequence_to_the_worker_with_the_emptier_kv_cache(
) -> None:
    s, mv = setup(workers=2, settings=Settings(), batch_size=4)
    mv.settings = dataclasses.replace(mv.settings, continuous_batching=True)
    first, second = mv.workers.values()
    first.kv_cache, second.kv_cache = (900, 1000), (100, 1000)  # as their handlers reported
    [send] = s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    assert send.worker is second


def test_continuous_batching_frees_the_slot_of_a_client_that_went_away() -> None:
    s, mv = setup(settings=Settings(), batch_size=1)
    mv.settings = dataclasses.replace(mv.settings, continuous_batching=True)
    [_send] = s.submit(FRONTEND, route(b"a", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"b", 0.0), [], now=0.0)
    gone, actions = s.cancel(FRONTEND, b"a", now=0.2)
    assert gone is mv and kinds(actions) == ["CancelRunning", "SendBatch"]
    assert actions[0].rid == b"a" and [p.rid for p in actions[1].requests] == [b"b"]


def test_continuous_batching_stops_a_generation_past_its_own_deadline() -> None:
    s, mv = setup(settings=Settings(), batch_size=2)
    mv.settings = dataclasses.replace(mv.settings, continuous_batching=True)
    [send] = s.submit(FRONTEND, route(b"a", 0.0, timeout_ms=2000), [], now=0.0)
    s.submit(FRONTEND, route(b"b", 0.0), [], now=0.0)  # no deadline of its own: runs on
    assert s.next_wakeup(float("inf")) == 2.0
    s.submit(FRONTEND, route(b"c", 0.0), [], now=0.0)  # waits for a slot
    assert s.progress(send.worker, b"a", now=1.0) == FRONTEND
    assert s.tick(now=1.9) == []
    actions = s.tick(now=2.1)
    assert kinds(actions) == ["CancelRunning", "Refuse", "SendBatch"]
    assert actions[0].rid == b"a" and actions[1].error.http_status == 504
    assert [p.rid for p in actions[2].requests] == [b"c"]
    # left: the step deadline (response_timeout from the worker's last word), no generation
    # deadline
    assert s.running_requests(mv) == 2
    assert s.next_wakeup(float("inf")) == (1.0 + mv.settings.response_timeout
                                           + protocol.STEP_REPORT_INTERVAL)


def continuous(workers: int = 1, **api) -> tuple[Scheduler, ModelVersion]:
    s, mv = setup(workers=workers, settings=Settings(), **api)
    mv.settings = dataclasses.replace(mv.settings, continuous_batching=True)
    return s, mv


def test_a_request_that_streamed_a_part_is_not_run_again_when_its_worker_dies() -> None:
    s, mv = continuous(workers=2, batch_size=4)
    spare = list(mv.workers.values())[1]
    spare.state = WorkerState.STARTING  # both requests go to the first worker
    [send] = s.submit(FRONTEND, route(b"streamed", 0.0), [], now=0.0)
    s.submit(FRONTEND, route(b"silent", 0.0), [], now=0.0)
    spare.state = WorkerState.SERVING
    dead = send.worker
    assert s.progress(dead, b"streamed", now=0.5) == FRONTEND  # its client has a part
    del mv.workers[dead.id]
    actions = s.worker_lost(dead, now=1.0)
    assert kinds(actions) == ["Refuse", "SendBatch"]
    assert actions[0].rid == b"streamed" and actions[0].error.http_status == 500
    assert "streamed part of its answer; it is not run again" in actions[0].error.message
    assert [p.rid for p in actions[1].requests] == [b"silent"]  # sent nothing: it moves
    assert actions[1].worker is not dead


def test_a_continuous_workers_steps_not_its_answers_keep_it_alive() -> None:
    s, _mv = continuous(batch_size=4, response_timeout=2)
    slack = protocol.STEP_REPORT_INTERVAL
    [send] = s.submit(FRONTEND, route(b"long", 0.0), [], now=0.0)  # not streamed: no parts
    for now in (1.0, 2.0, 3.0, 4.0):  # a generation longer than response_timeout
        s.stepped(send.worker, now)
        assert s.tick(now=now + 0.1) == []
    assert s.next_wakeup(float("inf")) == 4.0 + 2 + slack
    s.submit(FRONTEND, route(b"joins", 4.5), [], now=4.5)  # a join is no sign of a step
    assert s.next_wakeup(float("inf")) == 4.0 + 2 + slack
    [kill] = s.tick(now=4.0 + 2 + slack + 0.01)  # a step that hangs is still killed
    assert isinstance(kill, KillWorker) and "a step ran past response_timeout" in kill.reason


def test_a_batch_model_keeps_the_deadline_for_the_queue_alone() -> None:
    s, _mv = setup(settings=Settings(), response_timeout=30)
    [send] = s.submit(FRONTEND, route(b"a", 0.0, timeout_ms=2000), [], now=0.0)
    assert s.tick(now=5.0) == []  # running: bounded by response_timeout, not cancelled
    assert kinds(s.finished(send.worker, [ok(b"a")], now=6.0)) == ["Forward"]
