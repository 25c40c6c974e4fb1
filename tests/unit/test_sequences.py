"""A stateful model's sequences (TorchServe's sequenceBatching), as the scheduler runs them with
a fake clock: pinned to a worker, one request of each at a time, bounded, and closed."""

from __future__ import annotations

import logging

from test_scheduler import setup as scheduler_setup

from mservd import protocol
from mservd.config import Settings
from mservd.core.registry import ModelVersion
from mservd.core.scheduler import Forward, Refuse, Scheduler, SendBatch
from mservd.core.sequences import SequenceQueue
from mservd.core.worker_handle import WorkerState

FRONTEND = b"frontend-1"
STATEFUL = {"sequenceBatching": True, "batchSize": 4, "maxBatchDelay": 0,
            "maxNumSequence": 4, "maxSequenceJobQueueSize": 3, "sequenceMaxIdleMSec": 1000}


ONE_AT_A_TIME = {"batchSize": 1, "minWorkers": 1, "maxWorkers": 1}  # maxNumSequence as set


def setup(workers: int = 2, settings: Settings | None = None,
          **yaml) -> tuple[Scheduler, ModelVersion]:
    return scheduler_setup(workers, settings, model_yaml={**STATEFUL, **yaml})


def submit(s: Scheduler, rid: bytes, sequence: str | None, now: float, ends: bool = False,
           **kwargs):
    route = protocol.Route(rid, "m", None, None, sent=now, sequence=sequence,
                           ends_sequence=ends, **kwargs)
    return s.submit(FRONTEND, route, [], now=now)


def ok(*rids: bytes) -> list[protocol.Result]:
    return [protocol.Result(rid, protocol.head(200), b"{}") for rid in rids]


def sent(actions) -> list[tuple[str, list[bytes]]]:
    return [(a.worker.id, [p.rid for p in a.requests]) for a in actions
            if isinstance(a, SendBatch)]


def test_sequence_settings_are_read_from_model_config_and_shown_as_torchserve_names() -> None:
    _s, mv = setup()
    assert isinstance(mv.batcher, SequenceQueue)
    assert mv.settings_document() | STATEFUL == mv.settings_document()
    assert mv.settings.sequence_timeout_ms == 0  # TorchServe's default: no lifetime


def test_with_continuous_batching_a_sequences_next_request_joins_its_worker_while_one_runs(
        caplog) -> None:
    with caplog.at_level(logging.WARNING):
        s, mv = setup(continuousBatching=True)
    assert mv.settings.sequence_batching and isinstance(mv.batcher, SequenceQueue)
    assert "not applied" not in caplog.text
    assert sent(submit(s, b"a1", "A", 0.0)) == [("9000", [b"a1"])]
    assert sent(submit(s, b"b1", "B", 0.0)) == [("9001", [b"b1"])]  # the one holding fewest
    assert sent(submit(s, b"a2", "A", 0.01)) == [("9000", [b"a2"])]  # a1 still streams
    assert len(s.running["9000"].requests) == 2


def test_with_continuous_batching_a_worker_takes_no_more_than_its_free_slots() -> None:
    s, mv = setup(workers=1, continuousBatching=True, batchSize=2)
    submit(s, b"a1", "A", 0.0)
    submit(s, b"b1", "B", 0.0)
    assert submit(s, b"c1", "C", 0.0) == []  # both slots taken
    actions = s.finished(mv.workers["9000"], ok(b"a1"), now=0.1)
    assert sent(actions) == [("9000", [b"c1"])]


def test_the_handler_ends_a_sequence_in_an_answers_header_once_nothing_of_it_runs() -> None:
    s, mv = setup(workers=1, continuousBatching=True)
    submit(s, b"a1", "A", 0.0)  # a stream
    submit(s, b"a2", "A", 0.01)  # the request that ends it
    submit(s, b"b1", "B", 0.01)
    assert mv.batcher.open_count(0.02) == 2
    ends = protocol.head(200, headers={"TS_Request_Sequence_End": "A; other"})
    s.finished(mv.workers["9000"], [protocol.Result(b"a2", ends, b"{}")], now=0.05)
    assert mv.batcher.open_count(0.05) == 2  # a1 still runs
    s.finished(mv.workers["9000"], ok(b"a1"), now=0.06)
    assert mv.batcher.open_count(0.06) == 1  # closed, not left to idle out
    [send] = submit(s, b"a3", "A", 0.07)  # named again: opened anew
    assert send.requests[0].server_headers == {"ts_request_sequence_id": "A"}


def test_the_handler_may_end_a_sequence_in_a_streamed_parts_header() -> None:
    s, mv = setup(workers=1, continuousBatching=True)
    submit(s, b"a1", "A", 0.0)
    ends = protocol.head(200, headers={"ts_request_sequence_end": "A"})
    assert s.progress(mv.workers["9000"], b"a1", 0.05, ends) == FRONTEND
    assert mv.batcher.open_count(0.05) == 1  # its request still runs
    s.finished(mv.workers["9000"], ok(b"a1"), now=0.1)
    assert mv.batcher.open_count(0.1) == 0


def test_a_clients_end_sent_while_another_request_of_it_streams_closes_it_after_both() -> None:
    s, mv = setup(workers=1, continuousBatching=True)
    submit(s, b"a1", "A", 0.0)  # a stream
    submit(s, b"a2", "A", 0.01, ends=True)  # joins it, and ends the sequence
    s.finished(mv.workers["9000"], ok(b"a2"), now=0.05)
    assert mv.batcher.open_count(0.05) == 1  # a1 still runs
    s.finished(mv.workers["9000"], ok(b"a1"), now=0.1)
    assert mv.batcher.open_count(0.1) == 0  # closed, not left to idle out


def test_a_sequence_still_running_on_a_stopping_worker_does_not_move_until_done() -> None:
    s, mv = setup(workers=2, continuousBatching=True)
    submit(s, b"a1", "A", 0.0)  # streams on 9000
    mv.workers["9000"].state = WorkerState.STOPPING  # scaled down: it finishes a1, then stops
    assert submit(s, b"a2", "A", 0.01) == []  # not to 9001 while A's state runs on 9000
    assert sent(s.finished(mv.workers["9000"], ok(b"a1"), now=0.1)) == [("9001", [b"a2"])]
    s.finished(mv.workers["9001"], ok(b"a2"), now=0.2)
    assert mv.batcher.open_count(0.2) == 1 and mv.batcher.held("9001") == 1


def test_the_handlers_end_holds_when_its_last_queued_request_is_cancelled() -> None:
    s, mv = setup(workers=1, continuousBatching=True, batchSize=2)
    submit(s, b"a1", "A", 0.0)
    submit(s, b"b1", "B", 0.0)  # both slots taken
    submit(s, b"b2", "B", 0.01)
    submit(s, b"a2", "A", 0.02)
    ends = protocol.head(200, headers={"ts_request_sequence_end": "A"})
    actions = s.finished(mv.workers["9000"], [protocol.Result(b"a1", ends, b"{}")], now=0.05)
    assert sent(actions) == [("9000", [b"b2"])]  # the older one; a2 still queued
    assert mv.batcher.open_count(0.05) == 2
    s.cancel(FRONTEND, b"a2", now=0.06)  # its client gives up while it waits
    assert mv.batcher.open_count(0.06) == 1  # A closed, as its handler said


def test_a_sequence_id_with_a_semicolon_is_refused_400() -> None:
    s, _mv = setup(workers=1, continuousBatching=True)
    [refused] = submit(s, b"x", "mine;yours", 0.0)
    assert isinstance(refused, Refuse) and refused.error.http_status == 400
    assert "';'" in refused.error.message


def test_a_cancelled_stream_leaves_its_sequence_free_to_idle() -> None:
    s, mv = setup(workers=1, continuousBatching=True, sequenceMaxIdleMSec=100)
    submit(s, b"a1", "A", 0.0)
    s.cancel(FRONTEND, b"a1", now=0.05)  # the client went away mid-stream
    assert mv.batcher.open_count(0.1) == 1
    assert mv.batcher.open_count(0.2) == 0  # idle since the cancel, 0.1 s on


def test_max_num_sequence_is_at_least_a_batch_for_every_worker_as_in_torchserve() -> None:
    _s, mv = setup(maxNumSequence=4, batchSize=4, minWorkers=2, maxWorkers=3)
    assert mv.settings.max_num_sequence == 12 and mv.batcher.max_sequences == 12
    _s, mv = setup(maxNumSequence=20, batchSize=4, minWorkers=2, maxWorkers=3)
    assert mv.settings.max_num_sequence == 20


def test_a_sequence_runs_one_request_at_a_time_in_the_order_sent() -> None:
    s, mv = setup(workers=1)
    assert sent(submit(s, b"a1", "A", 0.0)) == [("9000", [b"a1"])]
    assert submit(s, b"a2", "A", 0.01) == []
    assert submit(s, b"a3", "A", 0.02) == []
    actions = s.finished(mv.workers["9000"], ok(b"a1"), now=0.05)
    assert sent(actions) == [("9000", [b"a2"])]  # not a2 and a3 together
    assert sent(s.finished(mv.workers["9000"], ok(b"a2"), now=0.1)) == [("9000", [b"a3"])]


def test_a_batch_holds_one_request_from_each_of_its_workers_sequences() -> None:
    s, mv = setup(workers=1)
    submit(s, b"a1", "A", 0.0)
    for i, (rid, seq) in enumerate(((b"b1", "B"), (b"a2", "A"), (b"c1", "C"), (b"b2", "B"))):
        assert submit(s, rid, seq, 0.01 + i / 1000) == []
    actions = s.finished(mv.workers["9000"], ok(b"a1"), now=0.05)
    assert sent(actions) == [("9000", [b"b1", b"a2", b"c1"])]  # b2 waits for b1
    assert sent(s.finished(mv.workers["9000"], ok(b"b1", b"a2", b"c1"), 0.1)) == [
        ("9000", [b"b2"])]


def test_a_sequence_stays_on_its_worker_while_another_worker_is_idle() -> None:
    s, mv = setup(workers=2)
    assert sent(submit(s, b"a1", "A", 0.0)) == [("9000", [b"a1"])]
    assert sent(submit(s, b"b1", "B", 0.0)) == [("9001", [b"b1"])]
    s.finished(mv.workers["9001"], ok(b"b1"), now=0.01)  # 9001 is idle now
    assert submit(s, b"a2", "A", 0.02) == []  # A's state lives in 9000: it waits for it
    assert sent(s.finished(mv.workers["9000"], ok(b"a1"), now=0.05)) == [("9000", [b"a2"])]
    assert sent(submit(s, b"b2", "B", 0.06)) == [("9001", [b"b2"])]


def test_new_sequences_that_come_together_are_shared_out_among_the_idle_workers() -> None:
    s, mv = setup(workers=2, maxNumSequence=8)  # each worker's share would hold all four
    for rid, sequence in ((b"a1", "A"), (b"b1", "B"), (b"c1", "C"), (b"d1", "D")):
        route = protocol.Route(rid, "m", None, None, sent=0.0, sequence=sequence)
        s.enqueue(FRONTEND, route, [], now=0.0)  # one frontend's turn: queued, then sent
    assert sent(s.dispatch(mv, 0.0)) == [("9000", [b"a1", b"b1"]), ("9001", [b"c1", b"d1"])]


def test_a_request_without_a_sequence_id_opens_one_and_is_told_it_starts() -> None:
    s, mv = setup(workers=1)
    [send] = submit(s, b"x", None, 0.0)
    headers = send.requests[0].server_headers
    assert headers["ts_request_sequence_id"].startswith("ts-seq-")
    assert headers["ts_request_sequence_start"] == "true"
    s.finished(mv.workers["9000"], ok(b"x"), now=0.01)
    [send] = submit(s, b"y", "given", 0.02)
    assert send.requests[0].server_headers == {"ts_request_sequence_id": "given"}


def test_more_sequences_than_max_num_sequence_are_refused_503_until_one_idles_out() -> None:
    s, mv = setup(workers=1, maxNumSequence=2, sequenceMaxIdleMSec=500, **ONE_AT_A_TIME)
    submit(s, b"a1", "A", 0.0)
    submit(s, b"b1", "B", 0.0)
    [refused] = submit(s, b"c1", "C", 0.1)
    assert isinstance(refused, Refuse) and refused.error.http_status == 503
    assert refused.error.type == "ServiceUnavailableException"
    assert "maxNumSequence" in refused.error.message
    s.finished(mv.workers["9000"], ok(b"a1"), now=0.2)
    s.finished(mv.workers["9000"], ok(b"b1"), now=0.3)
    assert isinstance(submit(s, b"c2", "C", 0.4)[0], Refuse)  # A idle 0.2 s of 0.5 s
    assert sent(submit(s, b"c3", "C", 0.75)) == [("9000", [b"c3"])]  # A has idled out
    assert mv.batcher.open_count(0.75) == 2  # B (idle since 0.3) and C


def test_a_sequence_queues_no_more_than_max_sequence_job_queue_size() -> None:
    s, _mv = setup(workers=1, maxSequenceJobQueueSize=2)
    submit(s, b"a1", "A", 0.0)  # running
    assert submit(s, b"a2", "A", 0.0) == [] and submit(s, b"a3", "A", 0.0) == []
    [refused] = submit(s, b"a4", "A", 0.0)
    assert refused.error.http_status == 503 and "maxSequenceJobQueueSize" in refused.error.message
    assert submit(s, b"b1", "B", 0.0) == []  # another sequence still queues


def test_the_request_that_ends_a_sequence_closes_it_once_answered() -> None:
    s, mv = setup(workers=1, maxNumSequence=1, **ONE_AT_A_TIME)
    submit(s, b"a1", "A", 0.0, ends=True)
    assert isinstance(submit(s, b"b1", "B", 0.01)[0], Refuse)  # one sequence allowed: A's
    s.finished(mv.workers["9000"], ok(b"a1"), now=0.02)
    assert mv.batcher.open_count(0.02) == 0
    assert sent(submit(s, b"b2", "B", 0.03)) == [("9000", [b"b2"])]


def test_a_dead_workers_sequence_goes_on_on_another_worker_and_its_request_runs_again() -> None:
    s, mv = setup(workers=2)
    submit(s, b"a1", "A", 0.0)  # to 9000
    submit(s, b"a2", "A", 0.01)  # queued behind it
    dead = mv.workers.pop("9000")
    actions = s.worker_lost(dead, now=0.1)
    assert sent(actions) == [("9001", [b"a1"])]  # retried first, then a2 after it
    assert sent(s.finished(mv.workers["9001"], ok(b"a1"), now=0.2)) == [("9001", [b"a2"])]


def test_a_dead_continuous_workers_running_requests_of_a_sequence_run_again_in_order() -> None:
    s, mv = setup(workers=2, continuousBatching=True)
    submit(s, b"a1", "A", 0.0)  # to 9000
    submit(s, b"a2", "A", 0.01)  # joins it there
    submit(s, b"a3", "A", 0.02)
    assert list(s.running["9000"].requests) == [b"a1", b"a2", b"a3"]
    dead = mv.workers.pop("9000")
    # one request of a sequence joins per take, in the order they came
    assert sent(s.worker_lost(dead, now=0.1)) == [("9001", [b"a1"])]
    assert sent(s.tick(0.11)) == [("9001", [b"a2"])]
    assert sent(s.tick(0.12)) == [("9001", [b"a3"])]


def test_a_stopped_workers_sequence_moves_to_a_live_worker() -> None:
    s, mv = setup(workers=2)
    submit(s, b"a1", "A", 0.0)
    s.finished(mv.workers["9000"], ok(b"a1"), now=0.01)
    mv.workers["9000"].state = WorkerState.STOPPING  # scaled down: it serves no more
    assert sent(submit(s, b"a2", "A", 0.02)) == [("9001", [b"a2"])]


def test_a_queued_sequence_request_past_its_deadline_is_answered_504() -> None:
    s, mv = setup(workers=1)
    submit(s, b"a1", "A", 0.0)
    submit(s, b"a2", "A", 0.0, timeout_ms=100)
    actions = s.tick(now=0.2)
    assert [(type(a), a.rid, a.error.http_status) for a in actions] == [(Refuse, b"a2", 504)]
    assert len(mv.batcher) == 0


def test_a_cancelled_sequence_request_leaves_the_queue() -> None:
    s, mv = setup(workers=1)
    submit(s, b"a1", "A", 0.0)
    submit(s, b"a2", "A", 0.0)
    assert s.cancel(FRONTEND, b"a2", now=0.01)[0] is mv
    actions = s.finished(mv.workers["9000"], ok(b"a1"), now=0.02)
    assert [type(a) for a in actions] == [Forward]


def test_a_describe_question_to_a_stateful_handler_runs_alone_in_no_sequence() -> None:
    s, mv = setup(workers=1, maxNumSequence=1, **ONE_AT_A_TIME)
    submit(s, b"a1", "A", 0.0)
    assert s.ask(mv, b"admin", b"q", protocol.describe_question(), now=0.01) == []
    submit(s, b"a2", "A", 0.02)
    assert sent(s.finished(mv.workers["9000"], ok(b"a1"), now=0.05)) == [("9000", [b"q"])]
    assert sent(s.finished(mv.workers["9000"], ok(b"q"), now=0.06)) == [("9000", [b"a2"])]


def test_a_worker_waits_its_batch_delay_for_its_other_sequences_and_no_longer() -> None:
    s, mv = setup(workers=1, maxBatchDelay=50)
    for rid, sequence in ((b"a1", "A"), (b"b1", "B")):  # one message: one batch
        s.enqueue(FRONTEND, protocol.Route(rid, "m", None, None, sent=0.0, sequence=sequence),
                  [], now=0.0)
    assert sent(s.dispatch(mv, now=0.0)) == [("9000", [b"a1", b"b1"])]
    s.finished(mv.workers["9000"], ok(b"a1", b"b1"), now=0.01)  # both sequences idle now
    assert submit(s, b"a2", "A", 0.02) == []  # B may send within the delay: wait for it
    assert s.next_wakeup(float("inf"), now=0.021) == 0.07
    assert sent(s.tick(now=0.07)) == [("9000", [b"a2"])]
    # nothing more is due but the running batch's own deadline: no spin
    assert s.next_wakeup(float("inf"), now=0.08) == 0.07 + mv.settings.response_timeout


def test_no_worker_of_a_stateful_model_is_lent() -> None:
    s, mv = setup(workers=1)
    s.leases.enabled = True
    s.leases.reply_prefix = b"ipc://"
    for i in range(20):  # lone requests, one after another, from one frontend
        submit(s, b"r%d" % i, "A", float(i))
        actions = s.finished(mv.workers["9000"], ok(b"r%d" % i), now=i + 0.5)
        assert all(isinstance(a, Forward) for a in actions)


def test_sequences_that_idled_out_leave_room_on_their_worker_for_new_ones() -> None:
    s, mv = setup(workers=2, maxNumSequence=4, sequenceMaxIdleMSec=100)  # 2 a worker
    for rid, sequence in ((b"a1", "A1"), (b"a2", "A2")):
        s.enqueue(FRONTEND, protocol.Route(rid, "m", None, None, sent=0.0, sequence=sequence),
                  [], now=0.0)
    assert sent(s.dispatch(mv, now=0.0)) == [("9000", [b"a1", b"a2"])]
    s.finished(mv.workers["9000"], ok(b"a1", b"a2"), now=0.01)  # 9000 holds two, idle
    assert sent(submit(s, b"b1", "B", 0.02)) == [("9001", [b"b1"])]  # 9000 has no room
    # A1 and A2 idled out at 0.11: 9000 takes a new one at once, not after 9001's batch
    assert sent(submit(s, b"c1", "C", 0.5)) == [("9000", [b"c1"])]


def test_a_describe_question_whose_worker_died_runs_again_and_holds_no_sequence() -> None:
    s, mv = setup(workers=2, maxNumSequence=1)
    s.ask(mv, b"admin", b"q1", protocol.describe_question(), now=0.0)  # to 9000
    s.ask(mv, b"admin", b"q2", protocol.describe_question(), now=0.0)  # to 9001
    submit(s, b"a1", "A", 0.01)  # queued: both workers busy
    dead = mv.workers.pop("9000")
    assert sent(s.worker_lost(dead, now=0.1)) == []  # 9001 is busy: q1 waits, first
    assert sent(s.finished(mv.workers["9001"], ok(b"q2"), now=0.2)) == [("9001", [b"q1"])]
    assert sent(s.finished(mv.workers["9001"], ok(b"q1"), now=0.3)) == [("9001", [b"a1"])]
    s.finished(mv.workers["9001"], ok(b"a1"), now=0.4)
    assert len(mv.batcher) == 0
    assert mv.batcher.open_count(5.0) == 0  # A idled out; no question left a sequence open
    assert sent(submit(s, b"b1", "B", 5.0)) == [("9001", [b"b1"])]


def test_sequence_batching_is_not_applied_without_an_idle_time(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        _s, mv = setup(sequenceMaxIdleMSec=0)  # TorchServe's default: not a stateful model
    assert not mv.settings.sequence_batching and not isinstance(mv.batcher, SequenceQueue)
    assert "sequenceBatching is not applied without sequenceMaxIdleMSec" in caplog.text


def test_only_true_marks_a_sequences_end_as_torchserve_reads_it() -> None:
    assert [protocol.says_yes(v) for v in ("true", " TRUE ", "True")] == [True] * 3
    assert not any(protocol.says_yes(v) for v in (None, "", "false", "1", "yes", "banana"))


def test_a_sequence_closes_once_idle_past_its_lifetime_however_recently_it_ran() -> None:
    s, mv = setup(workers=1, maxNumSequence=2, sequenceMaxIdleMSec=10_000,
                  sequenceTimeoutMSec=1000)
    submit(s, b"a1", "A", 0.0)
    s.finished(mv.workers["9000"], ok(b"a1"), now=0.1)
    submit(s, b"b1", "B", 0.5)
    submit(s, b"b2", "B", 0.6)  # queued behind b1
    assert mv.batcher.open_count(1.05) == 1  # A, idle past its second, closed; B busy
    s.finished(mv.workers["9000"], ok(b"b1"), now=1.6)  # b2 runs: B busy past its lifetime
    assert mv.batcher.open_count(1.7) == 1
    s.finished(mv.workers["9000"], ok(b"b2"), now=1.8)
    assert mv.batcher.open_count(1.8) == 0  # closed as soon as it had nothing


def test_many_open_sequences_close_in_the_order_they_went_idle() -> None:
    s, mv = setup(workers=2, maxNumSequence=300, sequenceMaxIdleMSec=1000, batchSize=8)
    now = 0.0
    for i in range(300):  # each answered at once: 300 idle sequences, 150 on each worker
        now = i / 1000
        [batch] = [a for a in submit(s, f"r{i}".encode(), f"S{i}", now)
                   if isinstance(a, SendBatch)]
        s.finished(batch.worker, ok(f"r{i}".encode()), now)
    assert submit(s, b"x", "NEW", now)[0].error.http_status == 503  # all 300 places taken
    assert mv.batcher.open_count(1.0995) == 200  # idle a second: S0 .. S99 closed, in order
    assert sent(submit(s, b"y", "S150", 1.1)) != []  # still open, and served at once
    assert mv.batcher.open_count(2.0) == 1 and len(mv.batcher) == 0


def test_an_empty_sequence_id_opens_a_new_sequence_and_an_overlong_one_is_refused_400() -> None:
    s, _mv = setup(workers=1)
    [batch] = submit(s, b"a1", "", 0.0)
    [pending] = batch.requests
    assert pending.sequence.startswith("ts-seq-")
    assert pending.server_headers[protocol.SEQUENCE_START] == "true"
    [refused] = submit(s, b"b1", "x" * 257, 0.01)
    assert isinstance(refused, Refuse) and refused.error.http_status == 400


def test_sequences_opened_and_ended_quickly_leave_no_lifetimes_behind() -> None:
    s, mv = setup(workers=1, maxNumSequence=1, sequenceTimeoutMSec=3_600_000)
    for i in range(1000):  # each opened, answered and ended at once, for an hour's lifetime
        submit(s, b"r%d" % i, None, i / 1000, ends=True)
        s.finished(mv.workers["9000"], ok(b"r%d" % i), now=i / 1000 + 0.0005)
    assert mv.batcher.open_count(1.0) == 0
    assert len(mv.batcher._ends) <= 2 * 1 + 64 + 1


def test_a_sequence_takes_requests_only_from_the_client_that_opened_it() -> None:
    s, mv = setup(workers=1)
    assert sent(submit(s, b"a1", "A", 0.0, client="10.0.0.1")) == [("9000", [b"a1"])]
    [refused] = submit(s, b"x1", "A", 0.01, client="10.0.0.2")  # knows the id, is not its opener
    assert isinstance(refused, Refuse) and refused.error.http_status == 403
    assert refused.error.type == "ForbiddenException"
    assert "Sequence A of model m version 1.0 was opened by another client" in (
        refused.error.message)
    [refused] = submit(s, b"x2", "A", 0.02)  # nor may a request whose frontend names no client
    assert refused.error.http_status == 403
    assert submit(s, b"a2", "A", 0.03, client="10.0.0.1") == []  # its opener's: queued
    assert sent(s.finished(mv.workers["9000"], ok(b"a1"), now=0.04)) == [("9000", [b"a2"])]


def test_a_sequence_whose_frontend_named_no_client_is_anyones() -> None:
    s, _mv = setup(workers=1)
    submit(s, b"a1", "A", 0.0)
    assert submit(s, b"a2", "A", 0.01, client="10.0.0.2") == []


def test_one_client_holds_at_most_half_of_max_num_sequence_by_default() -> None:
    s, mv = setup(workers=1, maxNumSequence=4, sequenceMaxIdleMSec=500, **ONE_AT_A_TIME)
    for rid in (b"a", b"b"):  # requests that name no sequence: each opens one
        assert not any(isinstance(a, Refuse) for a in submit(s, rid, None, 0.0,
                                                              client="10.0.0.1"))
    [refused] = submit(s, b"c", "C", 0.1, client="10.0.0.1")
    assert isinstance(refused, Refuse) and refused.error.http_status == 503
    assert ("has 2 sequences open for client 10.0.0.1, as many as one client may hold "
            "(max_sequences_per_client: 2)") in refused.error.message
    assert submit(s, b"d", "D", 0.1, client="10.0.0.2") == []  # another client still opens
    assert mv.batcher.open_count(0.1) == 3
    s.finished(mv.workers["9000"], ok(b"a"), now=0.2)  # a's sequence idles out by 0.7
    assert submit(s, b"c2", "C", 0.75, client="10.0.0.1") == []


def test_max_sequences_per_client_sets_how_many_one_client_holds() -> None:
    s, _mv = setup(workers=1, settings=Settings(max_sequences_per_client=1), maxNumSequence=4,
                  **ONE_AT_A_TIME)
    submit(s, b"a", "A", 0.0, client="10.0.0.1")
    [refused] = submit(s, b"b", "B", 0.0, client="10.0.0.1")
    assert "(max_sequences_per_client: 1)" in refused.error.message
    assert submit(s, b"a2", "A", 0.0, client="10.0.0.1") == []  # its open one goes on


def test_a_clients_own_sequence_start_header_never_reaches_the_handler() -> None:
    request = protocol.Request(b"r", protocol.CODEC_TORCHSERVE, [], {
        "ts_request_sequence_id": "A", "TS_Request_Sequence_Start": "true"}, [],
        server_headers={"ts_request_sequence_id": "A"})
    assert request.handler_headers() == {"ts_request_sequence_id": "A"}
    opened = protocol.Request(b"r", protocol.CODEC_TORCHSERVE, [], {}, [], server_headers={
        "ts_request_sequence_id": "ts-seq-1", "ts_request_sequence_start": "true"})
    assert opened.handler_headers()["ts_request_sequence_start"] == "true"  # the server's
