"""Lending idle workers to frontends: when the scheduler lends, takes back and counts."""

from __future__ import annotations

from test_scheduler import ok, route, setup

from mservd import protocol
from mservd.core.leases import LONE_BATCHES, RECALL_GRACE, Lend, Recall, Revoke
from mservd.core.scheduler import Forward, SendBatch

RUN = "ipc:///run/mservd"
F1 = f"{RUN}/reply-1-aa.sock".encode()
F2 = f"{RUN}/reply-2-bb.sock".encode()


def lending(workers: int = 2, **api):
    s, mv = setup(workers, **api)
    s.leases.enabled = True
    s.leases.reply_prefix = f"{RUN}/reply-".encode()
    for i, worker in enumerate(mv.workers.values()):
        worker.job_endpoint = f"{RUN}/jobs-{i}.sock"
    s.leases.lone[mv.key] = LONE_BATCHES  # a lone client so far
    return s, mv


def serve_one(s, fid: bytes, rid: bytes, now: float):
    """A request through the controller, answered: the actions after its answer."""
    sends = [a for a in s.submit(fid, route(rid, now), [], now=now) if isinstance(a, SendBatch)]
    [send] = sends
    return send.worker, s.finished(send.worker, [ok(rid)], now=now + 0.01, answered=True)


def test_an_idle_version_lends_the_worker_that_answered_to_its_frontend() -> None:
    s, _mv = lending(batch_size=4)
    worker, after = serve_one(s, F1, b"a", 1.0)
    assert after == [Lend(F1, protocol.Lease("m", "1.0", True, worker.job_endpoint, 4, 120.0))]
    assert s.leases.holds(worker)


def test_a_version_lends_only_after_a_run_of_batches_of_one_request() -> None:
    s, mv = lending(workers=1, batch_size=4)
    for rid in (b"x", b"y"):  # two in one message: one batch of two
        s.enqueue(F1, route(rid, 1.0), [], now=1.0)
    [two] = s.dispatch(mv, now=1.0)
    assert s.finished(two.worker, [ok(b"x"), ok(b"y")], now=1.1, answered=True) == []
    for i in range(LONE_BATCHES - 1):  # lone requests again, but not yet enough of them
        assert serve_one(s, F1, b"%d" % i, 2.0 + i)[1] == []
    assert [type(a) for a in serve_one(s, F1, b"lent", 9.0)[1]] == [Lend]


def test_nothing_is_lent_while_requests_queue_or_another_worker_runs() -> None:
    s, _mv = lending(workers=2, batch_size=1)
    [first] = s.submit(F1, route(b"a", 1.0), [], now=1.0)
    [_second] = s.submit(F1, route(b"b", 1.0), [], now=1.0)
    s.submit(F1, route(b"c", 1.0), [], now=1.0)  # queued: both workers busy
    after = s.finished(first.worker, [ok(b"a")], now=1.1, answered=True)
    assert [type(a) for a in after] == [SendBatch]  # the queue first
    assert s.finished(first.worker, [ok(b"c")], now=1.2, answered=True) == []  # b still runs
    assert not s.leases.holders


def test_no_lease_before_the_controller_turns_lending_on_or_to_a_frontend_without_a_reply_socket(
        ) -> None:
    s, _mv = lending()
    s.leases.enabled = False  # the controller's sockets are not bound yet
    assert serve_one(s, F1, b"a", 1.0)[1] == []
    s.leases.enabled = True
    assert serve_one(s, b"frontend-by-name", b"b", 2.0)[1] == []


def test_under_token_authorization_a_lease_carries_the_key_digest_and_a_rotation_ends_it(
        ) -> None:
    s, _mv = lending(batch_size=4)
    s.leases.key = (b"digest-1", 5000.0)
    worker, [lend] = serve_one(s, F1, b"a", 1.0)
    assert (lend.lease.key_digest, lend.lease.key_expires) == (b"digest-1", 5000.0)
    assert s.leases.of_model(None) == [Revoke(F1, worker.job_endpoint, False)]
    assert not s.leases.holders


def test_each_frontend_holds_one_lease_per_version() -> None:
    s, _mv = lending(workers=2)
    lent, _ = serve_one(s, F1, b"a", 1.0)
    other, again = serve_one(s, F1, b"b", 2.0)  # the other worker, for the same frontend
    assert other is not lent and again == []
    third, to_f2 = serve_one(s, F2, b"c", 3.0)
    assert third is other and [type(a) for a in to_f2] == [Lend] and to_f2[0].fid == F2


def test_a_lent_worker_is_recalled_only_when_no_other_is_idle_and_gets_the_batch_once_back(
        ) -> None:
    s, mv = lending(workers=2)
    lent, _ = serve_one(s, F1, b"a", 1.0)
    [send] = s.submit(F2, route(b"b", 2.0), [], now=2.0)  # the worker not lent
    assert send.worker is not lent and s.leases.holds(lent)
    recalled = s.submit(F2, route(b"c", 2.0, timeout_ms=50), [], now=2.0)
    assert recalled == [Revoke(F1, lent.job_endpoint, False), Recall(lent)]
    assert len(mv.batcher) == 1  # c waits in the queue, where its deadline holds ...
    assert s.submit(F2, route(b"d", 2.0), [], now=2.0) == []  # ... as do later ones
    [late] = s.tick(now=2.06)  # the leased batch still runs: c's deadline passes
    assert late.rid == b"c" and late.error.http_status == 504
    [take] = s.returned(lent, now=2.1)
    assert isinstance(take, SendBatch) and take.worker is lent
    assert [p.rid for p in take.requests] == [b"d"] and not s.leases.holds(lent)
    assert s.returned(lent, now=2.2) == []  # a second word changes nothing


def test_a_request_waiting_on_a_quick_recall_runs_even_with_a_deadline_of_zero() -> None:
    """An idle lent worker comes back within RECALL_GRACE: what waited for it is not timed
    out meanwhile (without the lease it would have run at once)."""
    s, _mv = lending(workers=1)
    lent, _ = serve_one(s, F1, b"a", 1.0)
    assert [type(a) for a in s.submit(F2, route(b"now", 2.0, timeout_ms=0), [], now=2.0)] == [
        Revoke, Recall]
    assert s.tick(now=2.0 + RECALL_GRACE / 2) == []
    [take] = s.returned(lent, now=2.0 + RECALL_GRACE * 0.9, used=False)
    assert [p.rid for p in take.requests] == [b"now"]


def test_an_idle_workers_recall_slowed_by_a_loaded_machine_still_runs_a_zero_deadline() -> None:
    """CI's two cores under the suite took over 10 ms to bring an idle worker's RETURNED back,
    and schemathesis's request with a deadline of 0 ms was answered 504; 30 ms is in grace."""
    s, _mv = lending(workers=1)
    lent, _ = serve_one(s, F1, b"a", 1.0)
    s.submit(F2, route(b"now", 2.0, timeout_ms=0), [], now=2.0)
    assert s.tick(now=2.03) == []
    [take] = s.returned(lent, now=2.035, used=False)
    assert [p.rid for p in take.requests] == [b"now"]


def test_the_loop_does_not_spin_through_a_recalls_grace() -> None:
    """A request past its deadline that waits on a recall's grace needs the loop only when
    the grace ends (or the worker's RETURNED comes): waking for it at once, again and again,
    spun the controller on a core the returning worker needed."""
    s, _mv = lending(workers=1)
    serve_one(s, F1, b"a", 1.0)
    s.submit(F2, route(b"now", 2.0, timeout_ms=0), [], now=2.0)
    assert s.next_wakeup(float("inf")) >= 2.0 + RECALL_GRACE


def test_the_loop_does_not_spin_while_a_queue_waits_on_a_recalled_worker() -> None:
    s, mv = lending(workers=2, batch_size=4)
    serve_one(s, F1, b"a", 1.0)  # its worker is lent to F1
    assert [type(a) for a in s.submit(F2, route(b"b", 2.0), [], now=2.0)] == [SendBatch]
    assert [type(a) for a in s.submit(F2, route(b"c", 2.0), [], now=2.0)] == [Revoke, Recall]
    # b's answer or the lent worker's RETURNED wakes the loop (or b's response timeout); past
    # c's batch delay a wake-up for the "idle" recalled worker would come again at once, a spin
    assert s.next_wakeup(float("inf")) == 2.0 + mv.settings.response_timeout


def test_a_lost_worker_tells_every_frontend_it_was_lent_to() -> None:
    s, _mv = lending(workers=1)
    worker, _ = serve_one(s, F1, b"a", 1.0)
    s.submit(F2, route(b"b", 2.0), [], now=2.0)  # recalls it from F1
    [take] = s.returned(worker, now=2.05)
    s.finished(take.worker, [ok(b"b")], now=3.1, answered=True)  # and it is lent to F2
    assert s.leases.holders == {worker.id: F2}
    assert s.worker_lost(worker, now=4.0) == [Revoke(F1, worker.job_endpoint, True),
                                             Revoke(F2, worker.job_endpoint, True)]
    assert not s.leases.holders and not s.leases.recalling


def test_an_auto_batched_version_is_lent_a_request_at_a_time() -> None:
    s, _mv = lending(workers=1, batch_size="auto")
    [lend] = serve_one(s, F1, b"a", 1.0)[1]
    assert lend.lease.batch == 1  # the batch sizes are the advisor's to try


def test_a_version_that_had_to_recall_a_worker_lends_nothing_for_a_while() -> None:
    s, _mv = lending(workers=1)
    worker, _ = serve_one(s, F1, b"a", 1.0)
    s.submit(F1, route(b"b", 2.0), [], now=2.0)  # a second request: the lease is recalled
    [take] = s.returned(worker, now=2.01)
    assert s.finished(take.worker, [ok(b"b")], now=2.02, answered=True) == []  # busy lately
    assert [type(a) for a in serve_one(s, F1, b"c", 3.1)[1]] == [Lend]  # quiet again


def test_a_recalled_lease_never_used_does_not_stop_lending() -> None:
    s, _mv = lending(workers=1)
    worker, _ = serve_one(s, F1, b"a", 1.0)
    s.submit(F1, route(b"b", 1.01), [], now=1.01)  # came before the LEASE did: recalled
    [take] = s.returned(worker, now=1.02, used=False)
    assert [type(a) for a in s.finished(take.worker, [ok(b"b")], now=1.03, answered=True)] \
        == [Lend]


def test_a_changed_default_version_ends_the_models_leases() -> None:
    s, _mv = lending(workers=1)
    worker, _ = serve_one(s, F1, b"a", 1.0)
    assert s.leases.of_model("m") == [Revoke(F1, worker.job_endpoint, False)]
    assert s.leases.of_model("m") == []


def test_served_batches_are_counted_and_forwarded_only_when_not_delivered() -> None:
    s, mv = lending(workers=1)
    [worker] = mv.workers.values()
    delivered = protocol.Served(F1, True, 0.002, [protocol.Result(b"a", protocol.head(200), b"")])
    assert s.served(worker, delivered) == []
    undelivered = protocol.Served(F1, False, 0.003, [ok(b"b")])
    assert s.served(worker, undelivered) == [Forward(F1, ok(b"b"))]
    vm = s.metrics.version(mv.key)
    assert vm.answers == {200: 2} and not s.running


def test_the_frontend_a_hung_leased_batch_was_sent_by_names_its_worker() -> None:
    s, mv = lending(workers=1)
    worker, _ = serve_one(s, F1, b"a", 1.0)
    workers = list(mv.workers.values())
    assert s.leases.borrowed(F1, worker.job_endpoint, workers) is worker
    assert s.leases.borrowed(F2, worker.job_endpoint, workers) is None  # never lent to it
